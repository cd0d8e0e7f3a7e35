"""Unit tests of the trainer's pieces: sharding, flat gradients, lr schedule, configs,
collective helpers (on MPI.COMM_SELF), metrics rows, checkpoints, and the command line's checks
(in process, as rank 0 of a pretended job)."""

import json
import re
import struct

import pytest
import torch
from mpi4py import MPI

import models
from tests.mpirun import FirstOf
from trainer import build, cli
from trainer.checkpoint import Checkpoints, Position, restore_rng, rng_state
from trainer.config import DEFAULTS, ConfigError, config_path, load_config, merge
from trainer.distributed import UsageError, agree, broadcast_tensors, sum_over_ranks
from trainer.flat import FlatSync
from trainer.gradients import GradientBuffer
from trainer.metrics import EpochMeter, MetricsLog
from trainer.sampler import ShardedSampler, evaluation_shard
from trainer.schedule import WarmupMultiStep, make_scheduler


@pytest.mark.parametrize("num_samples,world_size", [(10, 1), (10, 3), (12, 4), (2, 3), (101, 6)])
def test_shards_cover_every_sample_with_equal_lengths(num_samples, world_size):
    shards = []
    for rank in range(world_size):
        sampler = ShardedSampler(num_samples, rank, world_size, seed=5)
        sampler.set_epoch(2)
        shards.append(list(sampler))
        assert len(shards[-1]) == len(sampler) == -(-num_samples // world_size)
    union = [index for shard in shards for index in shard]
    assert set(union) == set(range(num_samples))
    if num_samples % world_size == 0:
        assert sorted(union) == list(range(num_samples))  # no padding: disjoint


def test_shards_reshuffle_per_epoch_deterministically_from_the_seed():
    def order(epoch, seed=1):
        sampler = ShardedSampler(50, 1, 2, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0, seed=1) != order(0, seed=2)


def test_sampler_rejects_bad_rank():
    with pytest.raises(ValueError):
        ShardedSampler(10, 3, 3)


@pytest.mark.parametrize("num_samples,world_size", [(10, 3), (7, 7), (3, 5)])
def test_evaluation_shards_cover_the_test_set_exactly_once(num_samples, world_size):
    parts = [evaluation_shard(num_samples, rank, world_size) for rank in range(world_size)]
    assert sorted(i for part in parts for i in part) == list(range(num_samples))


def test_gradient_buffer_flattens_and_writes_back():
    torch.manual_seed(0)
    model = models.create("mlp", 3, (1, 2, 2))
    model.layers[1].bias.requires_grad_(False)
    loss = model(torch.randn(4, 1, 2, 2)).sum()
    loss.backward()
    buffer = GradientBuffer(model.parameters(), torch.device("cpu"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert buffer.numel == sum(p.numel() for p in trainable)
    flat = buffer.gather()
    assert torch.equal(flat, torch.cat([p.grad.reshape(-1) for p in trainable]))
    assert buffer.gather().data_ptr() == flat.data_ptr()  # one buffer, reused
    replacement = torch.arange(buffer.numel, dtype=torch.float32)
    buffer.scatter(replacement)
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in trainable]), replacement)
    with pytest.raises(ValueError):
        buffer.scatter(torch.zeros(buffer.numel + 1))


def test_gradient_buffer_zero_fills_missing_grads():
    first, second = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    first.grad = torch.full((2,), 7.0)
    buffer = GradientBuffer([first, second], torch.device("cpu"))
    buffer.flat.fill_(-1)
    assert buffer.gather().tolist() == [7, 7, 0, 0, 0]
    buffer.scatter(torch.tensor([1.0, 2, 3, 4, 5]))
    assert second.grad.tolist() == [3, 4, 5]


def test_schedule_warms_up_linearly_from_lr_over_p_then_decays():
    factor = WarmupMultiStep(
        iters_per_epoch=10, warmup_epochs=2, start_factor=0.25, milestones=[5, 3], gamma=0.1
    )
    assert factor(0) == pytest.approx(0.25)
    assert factor(10) == pytest.approx(0.625)  # half-way through warm-up
    assert factor(19) == pytest.approx(0.25 + 0.75 * 19 / 20)
    assert factor(20) == pytest.approx(1.0)
    assert factor(29) == pytest.approx(1.0)
    assert factor(30) == pytest.approx(0.1)
    assert factor(50) == pytest.approx(0.01)


def test_scheduler_drives_the_optimizer_and_round_trips_its_state():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.4)
    scheduler = make_scheduler(
        optimizer, iters_per_epoch=4, warmup_epochs=1, workers=4, milestones=[2], gamma=0.5
    )
    lrs = []
    for _ in range(12):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[4:8] == pytest.approx([0.4] * 4)
    assert lrs[8:] == pytest.approx([0.2] * 4)
    fresh = make_scheduler(torch.optim.SGD([parameter], lr=0.4), 4, 1, 4, [2], 0.5)
    fresh.load_state_dict(scheduler.state_dict())
    assert fresh.last_epoch == 12


def test_every_model_has_a_valid_config():
    for name in models.available():
        config = load_config(config_path(name))
        assert set(config) == set(DEFAULTS)


def test_config_files_fill_in_defaults_and_flags_override(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"lr": 0.5, "lr_milestones": [3]}))
    config = load_config(path)
    assert config["lr"] == 0.5 and config["batch_size"] == DEFAULTS["batch_size"]
    merged = merge(config, {"lr": None, "batch_size": 8, "unrelated": 1})
    assert merged["lr"] == 0.5 and merged["batch_size"] == 8 and "unrelated" not in merged


@pytest.mark.parametrize(
    "content,fragment",
    [
        ('{"learning_rate": 1}', "unknown key"),
        ('{"batch_size": "big"}', "batch_size"),
        ('{"batch_size": true}', "batch_size"),
        (
            '{"lr_milestones": [true, 2]}',
            r"lr_milestones must be a list of whole epochs, like \[30, 60\], got \[True, 2\]",
        ),
        ('{"lr_milestones": [2.7]}', "lr_milestones must be a list of whole epochs"),
        ("[1, 2]", "one JSON object"),
        ("{", "cannot read"),
    ],
)
def test_bad_config_files_are_refused(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        load_config(path)


def test_a_config_file_reports_all_its_problems_at_once(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"learning_rate": 1, "batch_size": "big", "lr": [1], "momentum": 0.9}')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "unknown key(s) learning_rate" in message
    assert "batch_size must be like 32" in message and "lr must be like 0.1" in message
    assert "momentum must" not in message  # a valid value is no problem


def test_missing_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.json")


def test_collective_helpers_on_one_rank():
    comm = MPI.COMM_SELF
    agree(comm, None)
    with pytest.raises(UsageError, match="broken"):
        agree(comm, "broken")
    assert sum_over_ranks(comm, [1, 2.5]) == [1.0, 2.5]
    tensor = torch.arange(4.0)
    broadcast_tensors([tensor], comm)
    assert tensor.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--compression", "--teams", "4"], "--teams 4 must divide the number of workers 6"),
        (["--compression", "--teams", "0"], "--teams 0 must divide the number of workers 6"),
        (
            ["--compression", "--teams", "3", "--sag", "recursive"],
            "--sag recursive needs --teams a power of two, got 3; use --sag bruck",
        ),
    ],
)
def test_spardl_team_flags_are_checked_in_the_trainers_terms(flags, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        cli.parse_settings(flags, FirstOf(6))


@pytest.mark.parametrize(
    "flags",
    [
        ["--teams", "4"],
        ["--compression", "--compressor", "topk", "--teams", "4"],
    ],
)
def test_teams_must_divide_the_workers_for_every_method(flags):
    with pytest.raises(UsageError, match="--teams 4 must divide the number of workers 6"):
        cli.parse_settings(flags, FirstOf(6))


def test_sag_recursive_does_not_stop_a_method_without_it():
    flags = ["--compression", "--compressor", "topk", "--teams", "3", "--sag", "recursive"]
    args, _ = cli.parse_settings(flags, FirstOf(6))
    assert (args.teams, args.sag) == (3, "recursive")


def test_more_loader_workers_than_cpus_are_capped_with_a_note(monkeypatch, capsys):
    """torch warns (and a loader may stall) when a rank starts more workers than it has CPUs,
    as the ImageNet configs' 4 would on 2 cores."""
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: {0, 1})
    _, settings = cli.parse_settings(["--loader-workers", "4"], FirstOf(6))
    assert "loader workers" not in capsys.readouterr().err  # not before the later checks pass
    assert build.loader_workers(settings, FirstOf(6)) == 2
    assert (
        "4 loader workers (--loader-workers or the config) are more than the 2 CPU(s) this process "
        "may use; using 2" in capsys.readouterr().err
    )
    _, settings = cli.parse_settings(["--loader-workers", "2"], FirstOf(6))
    assert build.loader_workers(settings, FirstOf(6)) == 2
    assert "loader workers" not in capsys.readouterr().err


def test_an_empty_data_dir_is_refused():
    with pytest.raises(UsageError, match="--data-dir is empty; name a directory"):
        cli.parse_settings(["--data-dir", ""], FirstOf(6))


def test_a_rejected_run_leaves_no_directory_behind(tmp_path):
    log_dir, checkpoint_dir = tmp_path / "runs" / "a", tmp_path / "ckpt"
    with pytest.raises(UsageError, match="--density must lie in"):
        cli.parse_settings(
            ["--density", "2", "--log-dir", str(log_dir), "--checkpoint-dir", str(checkpoint_dir)],
            FirstOf(6),
        )
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="file is not a directory"):
        cli.parse_settings(["--log-dir", str(tmp_path / "file" / "logs")], FirstOf(6))


def test_an_older_checkpoint_is_checked_against_the_built_synchronizer(tmp_path):
    """A checkpoint whose settings lack teams and sag, or name no parameter count, is refused by
    what the built model and synchronizer say."""
    import compressors
    from allreducers.transports import local_group

    numel = sum(p.numel() for p in models.create("cnn", 10, (1, 8, 8)).parameters())
    run_info = {"model": "cnn", "dataset": "digits", "compressor": "spardl", "density": 0.05}
    flags = [
        "--no-overlap",  # the flat synchronizer's state (an overlapped run refuses it as such)
        "--compression",
        "--compressor",
        "spardl",
        "--density",
        "0.05",
        "--resume",
        "--checkpoint-dir",
        str(tmp_path),
    ]
    recursive = compressors.create(
        "spardl", local_group(1).rank(0), numel=numel, density=0.05, sag="recursive"
    )
    for synchronizer, extra, reason in (
        ({"numel": 5}, {}, f"parameters 5 (this run: {numel})"),
        (recursive.state_dict(), {}, "sag 'recursive' (here 'bruck')"),
        ({"numel": numel}, {"epoch": -7}, "epoch -7 (a count: a whole number >= 0)"),
    ):
        (tmp_path / "epoch-0001").mkdir(exist_ok=True)
        torch.save(
            {"nworkers": 1, "run_info": run_info, "synchronizer": synchronizer, **extra},
            tmp_path / "epoch-0001" / "rank-0000.pt",
        )
        with pytest.raises(UsageError, match=re.escape(reason)):
            build.build_trainer(flags, MPI.COMM_SELF)


def test_images_too_small_for_the_model_are_one_error_without_warnings(recwarn):
    from types import SimpleNamespace

    import datasets

    split = datasets.DataSplit(train=range(60), test=None, num_classes=10, input_shape=(1, 2, 2))
    with pytest.raises(UsageError, match="model cnn cannot train on batches of 1x2x2 images"):
        build.build_model(SimpleNamespace(dnn="cnn"), split, 8, MPI.COMM_SELF, torch.device("cpu"))
    assert not recwarn.list, [str(w.message) for w in recwarn.list]


def test_a_checkpoint_of_other_settings_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    epoch = tmp_path / "ckpt" / "epoch-0001"
    epoch.mkdir(parents=True)
    run_info = {
        "model": "cnn",
        "dataset": "digits",
        "compressor": "spardl",
        "density": 0.05,
        "batch_size": 32,
        "teams": 1,
        "sag": "bruck",
    }
    torch.save({"nworkers": 1, "run_info": run_info}, epoch / "rank-0000.pt")
    monkeypatch.setattr(build, "load_data", lambda *_: pytest.fail("the data was read"))
    flags = [
        "--compression",
        "--compressor",
        "spardl",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--log-dir",
        str(tmp_path / "log"),
        "--resume",
    ]
    for extra, reason in (
        (["--density", "0.1"], "density 0.05 (this run: 0.1)"),
        (["--density", "0.05", "--sag", "recursive"], "sag bruck (this run: recursive)"),
    ):
        with pytest.raises(UsageError, match=re.escape(f"does not fit this run: {reason}")):
            build.build_trainer(flags + extra, MPI.COMM_SELF)
    assert not (tmp_path / "log").exists()


def test_a_model_that_cannot_train_on_the_batches_is_refused_and_the_probe_leaves_no_trace():
    from types import SimpleNamespace

    import datasets

    split = datasets.DataSplit(train=range(60), test=None, num_classes=10, input_shape=(3, 32, 32))
    args = SimpleNamespace(dnn="resnet50")
    # Batch norm over the 1x1 maps of ResNet-50 on 32x32 images cannot train on one image.
    with pytest.raises(
        UsageError, match="resnet50 cannot train on batches of 3x32x32 images"
    ) as refused:
        build.build_model(args, split, 1, FirstOf(6), torch.device("cpu"))
    assert "shard" not in str(refused.value)
    build.build_model(args, split, 32, MPI.COMM_SELF, torch.device("cpu"))  # batches of 32 and 28
    # Nor can it on 6 ranks' shards of one sample each, whatever the batch size.
    one_each = datasets.DataSplit(
        train=range(6), test=None, num_classes=10, input_shape=(3, 32, 32)
    )
    with pytest.raises(
        UsageError,
        match="the 6 training samples give each of the 6 workers a shard of one "
        "sample: use fewer workers or more data",
    ):
        build.build_model(args, one_each, 32, FirstOf(6), torch.device("cpu"))
    args.dnn = "resnet20"
    torch.manual_seed(5)
    expected = models.create("resnet20", 10, (3, 32, 32)).state_dict()
    after = torch.rand(1)
    torch.manual_seed(5)
    model = build.build_model(args, split, 32, MPI.COMM_SELF, torch.device("cpu"))
    assert torch.equal(torch.rand(1), after)  # the probe drew no random numbers
    for key, value in model.state_dict().items():  # nor changed the batch-norm statistics
        assert torch.equal(value, expected[key]), key


@pytest.mark.parametrize(
    "samples,batch,sizes", [(9, 4, [4]), (12, 4, [4, 2]), (9, 1, [1] * 5), (8, 4, [4]), (2, 4, [1])]
)
def test_a_last_training_batch_of_one_sample_is_dropped(samples, batch, sizes):
    """Only after full batches: a shard of one sample (2 samples on 2 ranks) keeps its batch."""
    import datasets
    from trainer.data import make_loaders, smallest_training_batch

    data = datasets.split.ArrayDataset(
        torch.zeros(samples, 1, 2, 2), torch.zeros(samples), [0.0], [1.0]
    )
    split = datasets.DataSplit(data, data, num_classes=2, input_shape=(1, 2, 2))
    train, test = make_loaders(split, batch, 3, 0, 2, 0, 0, torch.device("cpu"))
    assert len(train) == len(sizes) and [len(labels) for _, labels in train] == sizes
    assert smallest_training_batch(samples, 2, batch) == min(sizes)
    assert sum(len(labels) for _, labels in test) == (samples + 1) // 2  # evaluation keeps them all


def test_download_only_fetches_what_does_not_load(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import datasets

    fetched = []
    monkeypatch.setattr(datasets, "download", lambda name, directory: fetched.append(name))
    args = SimpleNamespace(data_dir=str(tmp_path), download=True)
    split = build.load_data(args, {"dataset": "digits", "data_options": {}}, MPI.COMM_SELF)
    assert len(split.train) == 1437 and fetched == []
    with pytest.raises(UsageError, match="MNIST not found"):  # the stand-in fetched nothing
        build.load_data(args, {"dataset": "mnist", "data_options": {}}, MPI.COMM_SELF)
    assert fetched == ["mnist"]


def test_epoch_meter_summarises_means_per_sample_and_per_rank():
    meter = EpochMeter()
    stats = {"bytes_sent": 100, "seconds": {"comm": 0.5, "select": 0.25}}
    meter.add_step(loss=2.0, samples=3, compute_seconds=1.0, sync_seconds=1.0, sync_stats=stats)
    meter.add_step(loss=1.0, samples=1, compute_seconds=1.0, sync_seconds=1.0, sync_stats=stats)
    row = meter.summary(MPI.COMM_SELF)
    assert row["train_loss"] == pytest.approx(7 / 4)
    assert row["epoch_iters"] == 2
    assert row["bytes_sent_per_rank"] == 200
    assert row["comm_seconds"] == pytest.approx(1.0)
    assert row["select_seconds"] == pytest.approx(0.5)


def test_metrics_log_appends_rows_and_writes_tensorboard(tmp_path, capsys):
    row = {
        "epoch": 1,
        "max_epochs": 2,
        "train_loss": 1.0,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "lr": 0.1,
        "epoch_seconds": 1.0,
        "compute_seconds": 0.5,
        "sync_seconds": 0.4,
        "select_seconds": 0.1,
        "comm_seconds": 0.2,
        "bytes_sent_per_rank": 2.0**20,
        "compressor": "dense",
    }
    for epoch in (1, 2):
        log = MetricsLog(tmp_path, rank=0)
        log.log({**row, "epoch": epoch})
        log.close()
    MetricsLog(tmp_path / "other", rank=1).log(row)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert not (tmp_path / "other").exists()
    assert "test acc 50.00%" in capsys.readouterr().out


def tensorboard_events(path):
    """The events of one TensorBoard event file (TFRecords: length, its CRC, data, data's CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    data, events, position = path.read_bytes(), [], 0
    while position < len(data):
        length = struct.unpack("<Q", data[position : position + 8])[0]
        events.append(Event.FromString(data[position + 12 : position + 12 + length]))
        position += 16 + length
    return events


def test_metrics_log_start_hides_the_later_epochs_of_earlier_tensorboard_files(tmp_path):
    """A resumed run (from epoch 2) and a fresh run in a used --log-dir: each new event file starts
    with TensorBoard's purge marker at the first epoch it writes, so the older files' events from
    that epoch on are hidden instead of mixed with the new curves."""
    row = {
        "epoch": 1,
        "max_epochs": 3,
        "train_loss": 1.0,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "lr": 0.1,
        "epoch_seconds": 1.0,
        "compute_seconds": 0.5,
        "sync_seconds": 0.4,
        "select_seconds": 0.1,
        "comm_seconds": 0.2,
        "bytes_sent_per_rank": 1.0,
    }
    runs = []
    for after_epoch, epochs in [(0, (1, 2, 3)), (2, (3,)), (0, (1,))]:
        log = MetricsLog(tmp_path, rank=0)
        log.start(after_epoch)
        for epoch in epochs:
            log.log({**row, "epoch": epoch})
        log.close()
        # Event files are named by the second they are opened in: set this one aside, so that
        # the next run, within the same second, does not write over it.
        (written,) = tmp_path.glob("events.out.tfevents.*")
        runs.append(tensorboard_events(written.rename(tmp_path / f"run-{len(runs)}")))
    for events, purged_from, epochs in zip(runs, (1, 3, 1), [(1, 2, 3), (3,), (1,)]):
        starts = [
            event.step
            for event in events
            if event.HasField("session_log") and event.session_log.status == event.session_log.START
        ]
        assert starts == [purged_from]
        assert sorted({event.step for event in events if event.HasField("summary")}) == list(epochs)


def test_checkpoints_are_atomic_pruned_and_found(tmp_path):
    checkpoints = Checkpoints(tmp_path, MPI.COMM_SELF)
    assert checkpoints.newest_complete() is None
    for epoch in (1, 2, 3):
        checkpoints.save(epoch, {"epoch": epoch, "weights": torch.full((2,), float(epoch))})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0002", "epoch-0003"]
    assert not list(tmp_path.rglob("*.tmp"))
    assert checkpoints.newest_complete() == Position(3) == (3, 0)
    assert checkpoints.load(3)["weights"].tolist() == [3.0, 3.0]
    assert checkpoints.world(3) == 1 and (tmp_path / "epoch-0003" / "WORLD").read_text() == "1\n"
    (tmp_path / "epoch-0009").mkdir()  # another rank's newer epoch that this rank lacks
    assert checkpoints.newest_complete() == Position(3)
    checkpoints.save(Position(3, 40), {"epoch": 3})  # within epoch 4: after epoch 3's end
    assert checkpoints.newest_complete() == (3, 40) and str(Position(3, 40)).endswith("epoch 4")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "epoch-0009") == [
        "epoch-0003",
        "epoch-0003-iter-000040",
    ]
    # Another world size's checkpoint is complete once every one of its ranks' files is there.
    other = tmp_path / "epoch-0004"
    other.mkdir()
    (other / "WORLD").write_text("2\n")
    torch.save({}, other / "rank-0000.pt")
    assert checkpoints.newest_complete() == (3, 40)
    torch.save({}, other / "rank-0001.pt")
    assert checkpoints.newest_complete() == Position(4) and checkpoints.world(4) == 2


def test_rng_state_round_trip():
    saved = rng_state()
    first = torch.rand(3)
    restore_rng(saved)
    assert torch.equal(torch.rand(3), first)


def test_byte_counts_keep_their_digits_in_the_epoch_line():
    from trainer.metrics import format_bytes

    assert format_bytes(0) == "0 B"
    assert format_bytes(1000) == "1000 B"
    assert format_bytes(93_000) == "90.82 KiB"  # a sparse run on a small model: not "0.0 MiB"
    assert format_bytes(4.7 * 2**20) == "4.7 MiB"
    assert format_bytes(3 * 2**30) == "3 GiB"


def test_training_steps_reuse_one_result_buffer():
    """Every step's synchronizer call writes into the trainer's one result buffer (no 4n-byte
    allocation per step), and the parameters get exactly the synchronized gradient."""
    import compressors
    from trainer.loop import Trainer

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    sync = compressors.create("spardl", MPI.COMM_SELF, numel=21, density=0.5)
    outs, results = [], []
    original = sync.allreduce

    def recording(grad, out=None):
        outs.append(out)
        results.append(original(grad, out=out).clone())
        return results[-1]

    sync.allreduce = recording
    flat_sync = FlatSync(sync, model, torch.device("cpu"))
    batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(3)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = Trainer(
        model=model,
        train_loader=batches,
        test_loader=None,
        synchronizer=flat_sync,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        comm=MPI.COMM_SELF,
        device=torch.device("cpu"),
        log=None,
        max_epochs=1,
        iters_per_epoch=3,
        run_info={},
    )
    trainer._train_epoch(0)
    assert len(outs) == 3 and all(out is flat_sync.averaged for out in outs)
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.equal(flat, results[-1])


def test_metrics_log_start_keeps_the_epochs_a_resume_continues_from(tmp_path, capsys):
    rows = [{"epoch": epoch, "train_loss": 1.0 / epoch} for epoch in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + "{broken\n"
    )
    original = (tmp_path / "metrics.jsonl").read_text()
    log = MetricsLog(tmp_path, rank=0)
    log.start(2)  # resumed from the checkpoint of epoch 2: epoch 3 will be logged again
    assert [
        json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
    log.start(2)  # nothing to drop: no copy
    log.start(0)  # a fresh run
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    log.start(0)
    log.close()
    # Every file that lost rows was copied whole first; nothing else was.
    assert (tmp_path / "metrics.jsonl.1").read_text() == original
    assert [
        json.loads(line)["epoch"]
        for line in (tmp_path / "metrics.jsonl.2").read_text().splitlines()
    ] == [1, 2]
    assert sorted(path.name for path in tmp_path.glob("metrics.jsonl.*")) == [
        "metrics.jsonl.1",
        "metrics.jsonl.2",
    ]
    assert "kept the earlier rows" in capsys.readouterr().out


def test_progress_lines_when_stdout_is_not_a_terminal(monkeypatch, capsys):
    """Under mpiexec stdout is a pipe, so no progress bar: rank 0 prints a line now and then."""
    import compressors
    from trainer import loop

    monkeypatch.setattr(loop, "PROGRESS_SECONDS", 0.0)
    model = torch.nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = loop.Trainer(
        model=model,
        train_loader=[(torch.randn(4, 6), torch.randint(0, 3, (4,)))] * 2,
        test_loader=None,
        synchronizer=FlatSync(
            compressors.create("dense", MPI.COMM_SELF, numel=21), model, torch.device("cpu")
        ),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        comm=MPI.COMM_SELF,
        device=torch.device("cpu"),
        log=None,
        max_epochs=1,
        iters_per_epoch=2,
        run_info={},
    )
    trainer._train_epoch(0)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "epoch 1: 1/2 iterations",
        "epoch 1: 2/2 iterations",
    ]


@pytest.mark.parametrize(
    "method,kept",
    [
        ("topk", 1),
        ("oktopk", 1),
        ("gtopk", 1),
        ("gaussiank", 1),
        ("topkdsa", 1),
        ("spardl", 4),
        ("dense", 22_650),
    ],
)
def test_a_density_rounded_up_to_whole_entries_is_noted_and_recorded(method, kept, capsys):
    """--density 1e-9 keeps one entry per selection (per block of SparDL's 4 at P = 4): the
    effective density is what the method keeps, and rank 0 says so once."""
    import compressors
    from allreducers.transports import local_group

    density = 1.0 if method == "dense" else 1e-9  # what the trainer gives dense
    effective = local_group(4).run(
        lambda transport: (
            compressors.create(method, transport, numel=22_650, density=density).effective_density
        )
    )
    assert effective == [kept / 22_650] * 4
    sync = local_group(1).run(
        lambda transport: compressors.create(method, transport, numel=22_650, density=density)
    )[0]
    assert build.effective_density(sync, FirstOf(6)) == sync.effective_density
    noted = capsys.readouterr().err
    assert (noted.count("main_trainer.py: note:") == 1) == (method != "dense"), noted
    if method != "dense":
        assert (
            f"--density 1e-09 keeps 1 of the 22,650 gradient entries per call with {method}"
            in noted
        )


def test_a_density_that_rounds_little_is_not_noted(capsys):
    import compressors
    from allreducers.transports import local_group

    sync = local_group(1).run(
        lambda transport: compressors.create("spardl", transport, numel=22_650, density=0.01)
    )[0]
    assert build.effective_density(sync, FirstOf(6)) == 226 / 22_650
    assert capsys.readouterr().err == ""


def test_ranks_agree_on_stopping_flags_from_the_loss_and_the_gradient():
    from trainer.stopping import agree_flags

    finite = torch.ones(10)
    assert agree_flags(MPI.COMM_SELF, False, 1.0, finite) == (False, False, False)
    assert agree_flags(MPI.COMM_SELF, True, 1.0, finite) == (True, False, False)
    assert agree_flags(MPI.COMM_SELF, False, float("nan"), finite) == (False, True, False)
    for bad in (float("nan"), float("inf"), -float("inf")):
        gradient = finite.clone()
        gradient[7] = bad
        assert agree_flags(MPI.COMM_SELF, False, 1.0, gradient) == (False, False, True)
    assert agree_flags(MPI.COMM_SELF, False) == (
        False,
        False,
        False,
    )  # no gradient: the epoch's end


def test_ctrl_c_is_remembered_while_deferred_and_raised_otherwise():
    import signal

    from trainer.stopping import Interrupt

    interrupt = Interrupt()
    before = signal.getsignal(signal.SIGINT)
    with interrupt.deferred():
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested
        with pytest.raises(KeyboardInterrupt):  # a second one does not wait
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_every_synchronizer_state_loads_with_weights_only():
    """A checkpoint is read with torch.load(weights_only=True): each method's state (residuals,
    thresholds, counters after calls) must be tensors and plain values."""
    import io

    import compressors
    from tests.ranks import run_calls

    for method in compressors.available():
        _, states = run_calls(method, 2, 3000, 0.01, calls=2)
        buffer = io.BytesIO()
        torch.save(states[1], buffer)
        buffer.seek(0)
        assert torch.load(buffer, weights_only=True).keys() == states[1].keys(), method


def test_a_checkpoint_holding_another_object_is_refused_unread(tmp_path):
    import fractions
    import pickle

    from trainer.checkpoint import UnsafeCheckpoint

    checkpoints = Checkpoints(tmp_path, MPI.COMM_SELF)
    checkpoints.save(1, {"rng": rng_state(), "weights": torch.zeros(2)})
    assert checkpoints.load(1)["weights"].tolist() == [0.0, 0.0]
    checkpoints.save(2, {"weights": torch.zeros(2), "extra": fractions.Fraction(1, 3)})
    refused = (
        r"holds something other than tensors and plain values \(it names "
        r"fractions.Fraction\): refused, since loading it could run code"
    )
    with pytest.raises(UnsafeCheckpoint, match=refused):
        checkpoints.load(2)
    checkpoints.path(2).write_text("garbage\n")  # damaged: torch's reason, not its advice
    with pytest.raises(pickle.UnpicklingError, match="^Unsupported operand 103$"):
        checkpoints.load(2)


def test_a_note_when_ranks_share_a_gpu_with_overlapped_buckets():
    from trainer.build import shared_gpu_note

    assert shared_gpu_note(1, 1) is None and shared_gpu_note(4, 4) is None
    note = shared_gpu_note(4, 1)
    assert note.startswith("4 ranks share this host's 1 GPU:") and "--no-overlap" in note
    assert "nvidia-cuda-mps-control -d" in note
