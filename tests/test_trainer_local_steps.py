"""``--local-steps`` (DiLoCo in the trainer) under ``mpiexec``: rows count outer steps and bytes
per inner step, a resume within a round is bit-identical at the same world size, and a resume on
another number of ranks reshards the outer synchronizer's residuals and starts the round again
(bad flags: tests/test_trainer_cli.py's batch)."""

import json
import shutil

import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FLAGS = ["--method", "spardl", "--density", "0.05", "--local-steps", "3", "--max-epochs", "1"]
FLAGS += ["--max-iters", "8", "--checkpoint-every", "4"]


def run(workers, where, *extra):
    result = mpiexec(
        workers,
        "main_trainer.py",
        *FLAGS,
        "--checkpoint-dir",
        str(where / "ckpt"),
        "--log-dir",
        str(where / "log"),
        *extra,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return result


def model(where, rank, name="epoch-0001"):
    return torch.load(where / "ckpt" / name / f"rank-{rank:04d}.pt", weights_only=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """2 ranks, 8 iterations: outer steps after 3 and 6, checkpoints after 4 and 8."""
    where = tmp_path_factory.mktemp("local-steps")
    run(2, where)
    return where


def test_rows_count_outer_steps_and_the_outer_model_is_evaluated(straight):
    row = json.loads((straight / "log" / "metrics.jsonl").read_text().splitlines()[-1])
    assert (row["local_steps"], row["outer_steps"], row["iters"]) == (3, 2, 8)
    outer = (row["outer_optimizer"], row["outer_lr"], row["outer_momentum"])
    assert outer == ("nesterov", 0.7, 0.9)
    assert row["bytes_per_iter_per_rank"] == pytest.approx(row["bytes_sent_per_rank"] / 8)
    assert 0 < row["bytes_sent_per_rank"]
    states = [model(straight, rank) for rank in range(2)]
    start = states[0]["synchronizer"]["start"]
    assert torch.equal(start, states[1]["synchronizer"]["start"])  # θ_0: the same everywhere
    local = [torch.cat([t.reshape(-1) for t in s["model"].values()]) for s in states]
    assert not torch.equal(local[0], local[1])  # two inner steps since the last outer one


def test_a_resume_within_a_round_is_bit_identical_and_another_world_restarts_it(straight, tmp_path):
    for name in ("same", "other"):
        shutil.copytree(straight / "ckpt", tmp_path / name / "ckpt")
        shutil.rmtree(tmp_path / name / "ckpt" / "epoch-0001")  # killed after iteration 4
    run(2, tmp_path / "same", "--resume")
    for rank in range(2):
        a, b = model(straight, rank), model(tmp_path / "same", rank)
        assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
        residuals = [s["synchronizer"]["synchronizer"]["residual"] for s in (a, b)]
        assert torch.equal(*residuals)
    other = run(3, tmp_path / "other", "--resume")
    assert "resumed iteration 4 of a 2-rank run on 3 ranks; residuals resharded" in other.stdout
    states = [model(tmp_path / "other", rank) for rank in range(3)]
    # The round of inner steps 4-6 starts again from step 3's outer parameters. The 256 samples
    # of 4 iterations on 2 ranks are 2 whole iterations of 96 on 3: 6 iterations remain, so the
    # inner-step count goes from 3 to 9, with outer steps after 6 and 9.
    assert [(s["synchronizer"]["steps"], s["synchronizer"]["outer_steps"]) for s in states] == [
        (9, 3)
    ] * 3
    starts = [s["synchronizer"]["start"] for s in states]
    assert all(torch.equal(starts[0], start) for start in starts)


def test_an_overlapped_run_applies_each_average_a_round_late_and_resumes_bit_identically(tmp_path):
    """--outer-overlap: rounds end after 3 and 6; the first applies nothing, the second the
    first's average, and the second's is in flight at the checkpoint after 8 (kept in it)."""
    run(2, tmp_path / "straight", "--outer-overlap")
    shutil.copytree(tmp_path / "straight" / "ckpt", tmp_path / "again" / "ckpt")
    shutil.rmtree(tmp_path / "again" / "ckpt" / "epoch-0001")  # killed after iteration 4
    run(2, tmp_path / "again", "--outer-overlap", "--resume")
    for rank in range(2):
        a, b = model(tmp_path / "straight", rank), model(tmp_path / "again", rank)
        outer = a["synchronizer"]
        assert (outer["steps"], outer["outer_steps"], outer["outer_overlap"]) == (8, 1, True)
        assert outer["pending"] is not None
        assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
        for key in ("start", "pending"):
            assert torch.equal(outer[key], b["synchronizer"][key])
