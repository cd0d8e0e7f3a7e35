"""End to end: main_trainer.py trains the default under mpiexec and writes the contract's files."""

import json
import subprocess
import sys

import pytest
import torch

from tests.mpirun import ROOT, mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

REQUIRED_KEYS = {
    "epoch",
    "iters",
    "train_loss",
    "test_loss",
    "test_acc",
    "lr",
    "epoch_seconds",
    "sync_seconds",
    "comm_seconds",
    "select_seconds",
    "bytes_sent_per_rank",
    "compressor",
    "density",
    "nworkers",
    "compute_seconds",
}
CNN_DIGITS_PARAMETERS = 22_650


def read_rows(log_dir):
    """The rows of ``log_dir/metrics.jsonl``, one per epoch."""
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "workers,flags",
    [
        (2, []),
        (2, ["--compression", "--compressor", "spardl", "--density", "0.01"]),
        (3, []),
        (3, ["--compression", "--compressor", "spardl", "--density", "0.05"]),
        (4, ["--compression", "--compressor", "spardl", "--density", "0.01", "--teams", "2"]),
    ],
)
def test_default_run_writes_metrics_and_keeps_ranks_identical(tmp_path, workers, flags):
    result = mpiexec(
        workers,
        "main_trainer.py",
        "--max-epochs",
        "1",
        "--log-dir",
        str(tmp_path / "log"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        *flags,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("epoch   1/1") == 1  # one line per epoch, from rank 0 only
    (row,) = read_rows(tmp_path / "log")
    assert REQUIRED_KEYS <= set(row)
    assert row["epoch"] == 1 and row["nworkers"] == workers
    assert row["compressor"] == ("spardl" if flags else "dense")
    assert row["density"] == (float(flags[4]) if flags else 1.0)
    assert row["iters"] == row["epoch_iters"] == -(-1437 // (32 * workers))
    assert row["test_acc"] > 0.25 and row["train_loss"] > 0
    dense_bytes = 4 * CNN_DIGITS_PARAMETERS * row["iters"]  # one float32 gradient per iteration
    if flags:
        assert 0 < row["bytes_sent_per_rank"] < dense_bytes / 4
    else:
        assert row["bytes_sent_per_rank"] >= dense_bytes / 2
    assert row["epoch_seconds"] >= row["compute_seconds"] > 0
    assert row["sync_seconds"] >= row["comm_seconds"] > 0
    assert list((tmp_path / "log").glob("events.out.tfevents.*"))
    states = [
        torch.load(tmp_path / "ckpt" / "epoch-0001" / f"rank-{rank:04d}.pt", weights_only=True)
        for rank in range(workers)
    ]
    for state in states[1:]:
        for key, tensor in state["model"].items():
            assert torch.equal(tensor, states[0]["model"][key]), key


def test_single_process_without_mpiexec(tmp_path):
    result = subprocess.run(
        [sys.executable, "main_trainer.py", "--max-epochs", "2", "--log-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    rows = read_rows(tmp_path)
    assert [row["epoch"] for row in rows] == [1, 2]
    assert rows[-1]["nworkers"] == 1 and rows[-1]["test_acc"] > 0.8
