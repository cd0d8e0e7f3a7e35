"""The trainer's --fsdp and --hsdp, native and sparse, under mpiexec (Gloo, CPU)."""

import json

import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FLAGS = ["--max-epochs", "1", "--max-iters", "3"]
_RESIDUAL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def train(tmp_path, name, workers, *extra):
    log = ["--log-dir", str(tmp_path / name)]
    return mpiexec(workers, "main_trainer.py", *FLAGS, *log, *extra)


def row(tmp_path, name):
    (only,) = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
    return only


def test_fsdp_sparse_reduce_scatter_at_density_one_trains_as_native_fsdp(tmp_path):
    native = train(tmp_path, "native", 2, "--fsdp")
    assert native.returncode == 0, native.stderr
    sparse = train(tmp_path, "sparse", 2, "--fsdp", "--method", "spardl", "--density", "1")
    assert sparse.returncode == 0, sparse.stderr
    first, second = row(tmp_path, "native"), row(tmp_path, "sparse")
    assert first["sharding"] == second["sharding"] == "fsdp"
    assert first["compressor"] == "dense" and second["compressor"] == "spardl"
    assert abs(first["test_loss"] - second["test_loss"]) < 1e-4
    assert first["bytes_sent_per_rank"] > 0 and second["bytes_sent_per_rank"] > 0
    # The sparse method's phases come from its synchronizers; FSDP's own is all communication.
    assert second["select_seconds"] > 0 and first["select_seconds"] == 0


def test_hsdp_native_and_with_the_sparse_replica_hook(tmp_path, monkeypatch):
    # Two emulated hosts of two ranks (as scripts/cluster_network.sh describes them).
    monkeypatch.setenv("SPARDL_CLUSTER", json.dumps({"hosts": 2, "ranks_per_host": 2}))
    for name, extra in [("native", []), ("sparse", ["--method", "topk", "--density", "0.05"])]:
        result = train(tmp_path, name, 4, "--hsdp", *extra)
        assert result.returncode == 0, result.stderr
        assert row(tmp_path, name)["sharding"] == "hsdp"
        assert row(tmp_path, name)["ranks_per_host"] == 2
    assert row(tmp_path, "sparse")["select_seconds"] > 0  # the replica hook's selection


@pytest.mark.parametrize(
    ("workers", "extra", "message"),
    [
        (1, ["--fsdp"], "--fsdp needs at least 2 workers, got 1"),
        (2, ["--fsdp", "--no-overlap"], "--fsdp with --no-overlap"),
        (2, ["--hsdp"], "--hsdp needs at least 2 hosts"),
        (2, ["--fsdp", "--hsdp"], "not allowed with argument"),
    ],
)
def test_flags_that_cannot_combine_exit_2_with_one_line(tmp_path, workers, extra, message):
    result = train(tmp_path, "bad", workers, *extra)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("workers", "extra"),
    [
        (2, ["--fsdp", "--method", "spardl", "--density", "0.05"]),
        (4, ["--hsdp", "--method", "topk", "--density", "0.05"]),
        (2, ["--fsdp", "--method", "spardl", "--density", "0.05", "--residual-dtype", "bf16"]),
    ],
)
def test_a_sharded_run_resumes_as_if_it_had_never_stopped(tmp_path, monkeypatch, workers, extra):
    """Two epochs straight equal one epoch, then a resume for the second: the same rows, and
    the same model, momentum and residuals in the last checkpoint (gathered from the shards).
    The sparse FSDP run then goes on on 3 ranks, its residuals resharded per parameter.
    With ``--residual-dtype bf16`` the residuals are saved in bf16, and the run and its
    checkpoints say so, and a resume without it is refused in one line (exit 2)."""
    monkeypatch.setenv("SPARDL_CLUSTER", json.dumps({"hosts": 2, "ranks_per_host": 2}))
    same = ("iters", "train_loss", "test_loss", "test_acc", "bytes_sent_per_rank")
    dtype = "bf16" if "bf16" in extra else "fp32"

    def run(name, epochs, *more):
        result = mpiexec(
            workers,
            "main_trainer.py",
            "--max-epochs",
            str(epochs),
            "--max-iters",
            "3",
            "--momentum",
            "0.9",
            "--log-dir",
            str(tmp_path / name),
            "--checkpoint-dir",
            str(tmp_path / f"{name}-ckpt"),
            *extra,
            *more,
            timeout=240,
        )
        assert result.returncode == 0, result.stderr
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert all(json.loads(line)["residual_dtype"] == dtype for line in lines)
        return [{key: json.loads(line)[key] for key in same} for line in lines]

    straight = run("straight", 2)
    run("resumed", 1)
    assert run("resumed", 2, "--resume") == straight
    for rank in range(workers):
        saved = [
            torch.load(
                tmp_path / f"{name}-ckpt" / "epoch-0002" / f"rank-{rank:04d}.pt", weights_only=True
            )
            for name in ("straight", "resumed")
        ]
        for key, tensor in saved[0]["model"].items():
            assert torch.equal(tensor, saved[1]["model"][key]), key
        momentum = [s["optimizer"]["state"] for s in saved]
        assert momentum[0] and momentum[0].keys() == momentum[1].keys()
        for key, entry in momentum[0].items():
            assert torch.equal(entry["momentum_buffer"], momentum[1][key]["momentum_buffer"]), key
        comms = [s["synchronizer"]["comms"] for s in saved]
        assert comms[0] and comms[0].keys() == comms[1].keys()
        for name, state in comms[0].items():
            for numel, sync in state["synchronizers"].items():
                again = comms[1][name]["synchronizers"][numel]
                assert torch.equal(sync["residual"], again["residual"]), (name, numel)
                assert sync["residual"].dtype == _RESIDUAL_DTYPES[dtype], (name, numel)
        assert saved[0]["synchronizer"]["residual_dtype"] == dtype
        assert saved[0]["run_info"]["residual_dtype"] == dtype
    if workers == 2 and dtype == "fp32" and "--fsdp" in extra:  # on 3 ranks: resharded
        more = mpiexec(
            3,
            "main_trainer.py",
            *("--max-epochs", "3", "--max-iters", "3", "--momentum", "0.9"),
            *("--checkpoint-dir", str(tmp_path / "resumed-ckpt"), "--resume", *extra),
            timeout=240,
        )
        assert more.returncode == 0, more.stderr
        assert "of a 2-rank run on 3 ranks; residuals resharded" in more.stdout
    if dtype == "bf16":  # resumed with float32 residuals: refused
        flags = [flag for flag in extra if flag not in ("--residual-dtype", "bf16")]
        checkpoints = str(tmp_path / "resumed-ckpt")
        refused = mpiexec(
            workers,
            "main_trainer.py",
            *("--max-epochs", "3", "--checkpoint-dir", checkpoints, "--resume", *flags),
            timeout=240,
        )
        assert refused.returncode == 2, refused.stderr
        assert "does not fit this run: residual_dtype bf16 (this run: fp32" in refused.stderr
        assert "Traceback" not in refused.stderr
