"""What the trainer learns from: evaluations within epochs (--eval-every) do not change it, and
momentum correction takes SGD's momentum into the synchronizer."""

import json
import pickle

import numpy as np
import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# CIFAR-10's training images are augmented with random crops and flips drawn from torch's
# generator, which a test loader draws from too: evaluations must leave it as it was.
FLAGS = ["--dataset", "cifar10", "--batch-size", "4", "--eval-batch-size", "8"]
FLAGS += ["--compression", "--compressor", "spardl", "--density", "0.05", "--max-iters", "3"]


def cifar10(root):
    """A CIFAR-10 folder in the archive's format: 5 batches of 8 training images, 8 test ones."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, 8).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


def train(tmp_path, name, *extra):
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "2",
        "--log-dir",
        str(tmp_path / name),
        "--checkpoint-dir",
        str(tmp_path / f"{name}-ckpt"),
        "--data-dir",
        str(tmp_path / "data"),
        *FLAGS,
        *extra,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]


def test_runs_that_differ_only_in_eval_every_end_with_the_same_weights(tmp_path):
    cifar10(tmp_path / "data")
    plain = train(tmp_path, "plain")
    often = train(tmp_path, "often", "--eval-every", "2")
    assert [row["iters"] for row in plain] == [3, 6]
    # Rows after iterations 2 and 4 (within epochs 1 and 2), and each epoch's own row.
    assert [(row["epoch"], row["iters"], row.get("within_epoch", False)) for row in often] == [
        (1, 2, True),
        (1, 3, False),
        (2, 4, True),
        (2, 6, False),
    ]
    assert [row["epoch_iters"] for row in often] == [2, 1, 1, 2]
    assert often[3]["test_acc"] == plain[1]["test_acc"]
    for rank in range(2):
        states = [
            torch.load(
                tmp_path / f"{name}-ckpt" / "epoch-0002" / f"rank-{rank:04d}.pt", weights_only=True
            )
            for name in ("plain", "often")
        ]
        for key, tensor in states[0]["model"].items():
            assert torch.equal(tensor, states[1]["model"][key]), key
        for key, state in states[0]["optimizer"]["state"].items():
            assert torch.equal(
                state["momentum_buffer"], states[1]["optimizer"]["state"][key]["momentum_buffer"]
            )


def test_eval_every_below_zero_is_a_usage_error(tmp_path):
    result = mpiexec(1, "main_trainer.py", "--eval-every", "-1", "--log-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--eval-every must be at least 0, got -1" in result.stderr


def test_momentum_correction_moves_sgds_momentum_into_the_synchronizer(tmp_path):
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "1",
        "--max-iters",
        "3",
        "--momentum",
        "0.9",
        "--compression",
        "--compressor",
        "spardl",
        "--density",
        "0.05",
        "--method-option",
        "momentum=0.9",
        "--log-dir",
        str(tmp_path / "log"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    )
    assert result.returncode == 0, result.stderr
    assert "SGD runs without it (--momentum 0.9 unused)" in result.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").open()]
    assert row["momentum"] == 0.9 and row["nesterov"] is False
    state = torch.load(tmp_path / "ckpt" / "epoch-0001" / "rank-0000.pt", weights_only=True)
    assert state["optimizer"]["param_groups"][0]["momentum"] == 0.0
    buckets = state["synchronizer"]["buckets"].values()
    assert all(bucket["state"]["velocity"].abs().sum() > 0 for bucket in buckets)
