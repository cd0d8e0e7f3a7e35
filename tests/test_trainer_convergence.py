"""Real data: the small CNN on Fashion-MNIST, 4 ranks, one epoch, dense versus SparDL at 1%."""

import json

import pytest

from datasets.mnist import DEBIAN_FASHION_MNIST
from tests.mpirun import mpiexec

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.skipif(
        not DEBIAN_FASHION_MNIST.is_dir(),
        reason=f"{DEBIAN_FASHION_MNIST} is absent: apt-get install dataset-fashion-mnist",
    ),
]

# One epoch of 469 iterations per rank (batch 32 x 4 ranks), warm-up from lr/4 over it.
FLAGS = [
    "--dnn",
    "cnn",
    "--dataset",
    "fashion-mnist",
    "--max-epochs",
    "1",
    "--batch-size",
    "32",
    "--lr",
    "0.05",
    "--warmup-epochs",
    "1",
    "--lr-milestones",
    "",
]


def test_spardl_converges_like_dense_on_fashion_mnist(tmp_path):
    accuracy = {}
    for name, flags in (
        ("dense", []),
        ("spardl", ["--compression", "--compressor", "spardl", "--density", "0.01"]),
    ):
        result = mpiexec(
            4, "main_trainer.py", *FLAGS, *flags, "--log-dir", str(tmp_path / name), timeout=400
        )
        assert result.returncode == 0, result.stderr
        (row,) = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        assert row["compressor"] == name and row["nworkers"] == 4
        accuracy[name] = row["test_acc"]
    assert accuracy["dense"] > 0.80, accuracy
    assert accuracy["spardl"] > 0.80, accuracy
    assert accuracy["spardl"] > accuracy["dense"] - 0.03, accuracy
