"""The trainer's PyTorch-DDP methods (ddp, ddp_fp16, ddp_bf16, powersgd) under mpiexec, and
their option checks."""

import json
import subprocess

import pytest
import torch
from mpi4py import MPI

import main_trainer
from tests.mpirun import ROOT, FirstOf, command, environment, mpiexec_together
from trainer import cli
from trainer.distributed import UsageError
from trainer.torch_ddp import powersgd_entries

KEYS = {
    "epoch_seconds",
    "iters",
    "compute_seconds",
    "sync_seconds",
    "exposed_sync_seconds",
    "comm_seconds",
    "select_seconds",
    "bytes_sent_per_rank",
    "compressor",
    "overlap",
    "bucket_mb",
}
RUNS = {
    "dense": ["--method", "dense"],
    "ddp": ["--method", "ddp"],
    "ddp_fp16": ["--method", "ddp_fp16"],
    "ddp_bf16": ["--compressor", "ddp_bf16"],
    "powersgd": ["--method", "powersgd", "--method-option", "rank=2"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of RUNS on 2 ranks, 3 iterations of one epoch, started together."""
    base = tmp_path_factory.mktemp("ddp_methods")
    argv = {
        name: ("main_trainer.py", "--max-epochs", "1", "--max-iters", "3", *flags)
        + ("--log-dir", str(base / name), "--checkpoint-dir", str(base / name / "ckpt"))
        for name, flags in RUNS.items()
    }
    results = mpiexec_together([(2, args) for args in argv.values()], timeout=300)
    return {
        name: (result.returncode, result.stderr, base / name) for name, result in zip(argv, results)
    }


def _row(directory):
    (line,) = (directory / "metrics.jsonl").read_text().splitlines()
    return json.loads(line)


def _weights(directory, rank):
    path = directory / "ckpt" / "epoch-0001" / f"rank-{rank:04d}.pt"
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("method", ["ddp", "ddp_fp16", "ddp_bf16", "powersgd"])
def test_a_ddp_method_trains_and_records_the_metrics(runs, method):
    status, err, directory = runs[method]
    assert status == 0, err
    row = _row(directory)
    assert KEYS <= set(row) and row["compressor"] == method and row["iters"] == 3
    assert row["sync_seconds"] >= row["exposed_sync_seconds"] >= 0
    assert row["epoch_seconds"] >= row["compute_seconds"] > 0
    dense_bytes = 4 * 22_650  # the cnn's float32 gradient, all-reduced by 2 ranks: 1x
    assert 0 < row["bytes_sent_per_rank"] <= 3 * dense_bytes * 1.001
    if method != "ddp":
        assert row["comm_seconds"] > 0
    if method == "powersgd":
        assert row["rank"] == 2 and row["start_iter"] == 2
    first, second = _weights(directory, 0), _weights(directory, 1)
    assert all(torch.equal(first[key], second[key]) for key in first)


@pytest.mark.mpi
@pytest.mark.slow
def test_ddp_gives_the_loss_and_weights_of_dense(runs):
    for name in ("dense", "ddp"):
        assert runs[name][0] == 0, runs[name][1]
    dense, ddp = _row(runs["dense"][2]), _row(runs["ddp"][2])
    assert ddp["train_loss"] == pytest.approx(dense["train_loss"], rel=1e-5)
    assert ddp["bytes_sent_per_rank"] == pytest.approx(dense["bytes_sent_per_rank"], rel=0.01)
    expected, got = _weights(runs["dense"][2], 0), _weights(runs["ddp"][2], 0)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--method", "powersgd", "--method-option", "rank=0"], "rank must be at least 1"),
        (["--method", "powersgd", "--method-option", "start_iter=1"], "at least 2"),
        (["--method", "powersgd", "--method-option", "depth=3"], "valid keys: rank, start_iter"),
        (["--method", "ddp", "--method-option", "rank=2"], "ddp has no option 'rank'"),
        (["--method", "ddp_fp16", "--no-overlap"], "--no-overlap has no meaning"),
        (["--method", "ddp", "--compressor", "topk"], "name different methods"),
        (["--method", "nonesuch"], "or a DDP method: ddp, ddp_fp16"),
    ],
)
def test_a_bad_ddp_method_flag_is_one_line(flags, fragment):
    with pytest.raises(UsageError) as refused:
        cli.parse_settings(flags, FirstOf(4))
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_a_bad_option_exits_with_status_2(capsys):
    assert main_trainer.main(["--method", "powersgd", "--method-option", "rank=x"]) == 2
    assert "rank takes a whole number" in capsys.readouterr().err
    assert MPI.COMM_WORLD.Get_size() == 1


def test_method_options_and_powersgd_bytes():
    args, _ = cli.parse_settings(
        ["--method", "powersgd", "--method-option", "start-iter=10"], FirstOf(4)
    )
    assert args.compressor == "powersgd" and args.density == 1.0
    assert args.method_options == {"rank": 4, "start_iter": 10}
    # a 64x576 convolution kernel compressed at rank 4, a bias and a small matrix whole
    assert powersgd_entries([(64, 64, 3, 3), (64,), (10, 3)], 4) == (64 + 576) * 4 + 64 + 30


@pytest.mark.mpi
@pytest.mark.slow
def test_powersgd_resumes_exactly_and_at_another_world_size(tmp_path):
    """Its error feedback, matrices, count and generator are checkpointed: 2 epochs equal 1 and
    a resumed 1; a 2-rank checkpoint resumes on 3 with the pending error conserved."""
    flags = ["--method", "powersgd", "--method-option", "rank=2", "--max-iters", "4"]

    def train(workers, name, epochs, *extra):
        argv = command(workers, "main_trainer.py", "--max-epochs", str(epochs), *flags, *extra)
        argv += ["--log-dir", str(tmp_path / name), "--checkpoint-dir", str(tmp_path / f"{name}c")]
        result = subprocess.run(
            argv, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        return result

    train(2, "straight", 2)
    train(2, "split", 1)
    train(2, "split", 2, "--resume")
    saved = torch.load(tmp_path / "splitc" / "epoch-0001" / "rank-0000.pt", weights_only=True)
    assert (
        saved["synchronizer"]["powersgd"]["iter"] == 4
        and saved["synchronizer"]["powersgd"]["error_dict"]
    )
    for rank in range(2):
        a, b = (
            torch.load(
                tmp_path / f"{name}c" / "epoch-0002" / f"rank-{rank:04d}.pt", weights_only=True
            )
            for name in ("straight", "split")
        )
        assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
    from trainer.resume import reshard_state

    old = [
        torch.load(tmp_path / "splitc" / "epoch-0002" / f"rank-{r:04d}.pt", weights_only=True)[
            "synchronizer"
        ]
        for r in range(2)
    ]
    new = reshard_state(old, 3)
    for bucket, error in old[0]["powersgd"]["error_dict"].items():
        before = sum(state["powersgd"]["error_dict"][bucket].double() for state in old) / 2
        after = sum(state["powersgd"]["error_dict"][bucket].double() for state in new) / 3
        assert torch.allclose(before, after, rtol=1e-6, atol=1e-9) and error.abs().sum() > 0
    resumed = train(3, "split", 3, "--resume")
    assert "of a 2-rank run on 3 ranks; residuals resharded" in resumed.stdout
