"""The trainer's overlapped synchronization (the default) against --no-overlap, under mpiexec."""

import json

import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FLAGS = ["--compression", "--compressor", "spardl", "--density", "0.05", "--max-iters", "4"]


def train(tmp_path, name, *extra):
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "1",
        "--log-dir",
        str(tmp_path / name),
        "--checkpoint-dir",
        str(tmp_path / f"{name}-ckpt"),
        *FLAGS,
        *extra,
    )
    return result


def checkpoint(tmp_path, name, rank):
    path = tmp_path / f"{name}-ckpt" / "epoch-0001" / f"rank-{rank:04d}.pt"
    return torch.load(path, weights_only=True)


def test_small_buckets_overlap_and_every_rank_keeps_the_same_weights(tmp_path):
    result = train(tmp_path, "buckets", "--bucket-mb", "0.02")  # the CNN in 3 buckets
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "buckets" / "metrics.jsonl").open()]
    assert row["overlap"] is True and row["bucket_mb"] == 0.02
    assert 0 < row["exposed_sync_seconds"] <= row["sync_seconds"] + 1e-9
    first, second = (checkpoint(tmp_path, "buckets", rank) for rank in (0, 1))
    for key, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][key]), key
    layouts = first["synchronizer"]["buckets"]
    assert len(layouts) == 3
    names = [name for entry in layouts.values() for name in entry["numbers"]]
    assert len(names) == len(set(names)) and set(names) <= set(first["model"])
    assert sum(sum(entry["sizes"]) for entry in layouts.values()) == 22650  # every parameter


def test_no_overlap_is_one_flat_call_and_checkpoints_resume_only_in_their_mode(tmp_path):
    result = train(tmp_path, "flat", "--no-overlap")
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "flat" / "metrics.jsonl").open()]
    assert row["overlap"] is False and row["bucket_mb"] is None
    assert row["exposed_sync_seconds"] == pytest.approx(row["sync_seconds"])
    assert checkpoint(tmp_path, "flat", 0)["synchronizer"]["residual"].numel() == 22650
    # The flat checkpoint does not resume overlapped, and the message names the flag.
    again = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "flat-ckpt"),
        "--resume",
        *FLAGS,
    )
    assert again.returncode == 2
    assert "resume it with --no-overlap" in again.stderr
    assert again.stderr.count("error:") == 1


def test_a_bucket_size_that_is_not_positive_is_refused():
    result = mpiexec(2, "main_trainer.py", "--bucket-mb", "0", timeout=120)
    assert result.returncode == 2
    assert "--bucket-mb must be a number of MiB above 0, got 0" in result.stderr


def test_clipping_synchronizes_after_backward_and_says_so(tmp_path):
    result = train(tmp_path, "clipped", "--clip-grad-norm", "1.0")
    assert result.returncode == 0, result.stderr
    assert "--clip-grad-norm clips each worker's whole gradient" in result.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "clipped" / "metrics.jsonl").open()]
    assert row["overlap"] is False
