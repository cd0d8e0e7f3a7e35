"""Resuming at another world size (docs/ELASTIC.md): a checkpoint written within an epoch
(``--checkpoint-every``) by 4 ranks continues on 3, one by 2 continues on 4, with the residuals
resharded and the pending update conserved; at the same world size a resume within an epoch
stays bit-identical."""

import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from compressors.reshard import pending_update
from tests.mpirun import ROOT, command, environment, mpiexec
from trainer.resume import reshard_state

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FLAGS = ["--compression", "--compressor", "spardl", "--density", "0.02"]


def run(workers, tmp_path, *extra):
    result = mpiexec(
        workers,
        "main_trainer.py",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--log-dir",
        str(tmp_path / "log"),
        *FLAGS,
        *extra,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return result


def states(directory, workers):
    return [
        torch.load(directory / f"rank-{rank:04d}.pt", weights_only=True) for rank in range(workers)
    ]


def test_four_ranks_killed_within_an_epoch_go_on_on_three(tmp_path):
    run(
        4,
        tmp_path,
        "--max-epochs",
        "1",
        "--checkpoint-every",
        "5",
        "--method-option",
        "momentum=0.9",
    )
    within = tmp_path / "ckpt" / "epoch-0000-iter-000010"
    assert (within / "WORLD").read_text() == "4\n"
    saved = states(within, 4)
    shutil.rmtree(tmp_path / "ckpt" / "epoch-0001")  # as if killed after iteration 10
    for buffer in ("residual", "velocity"):
        before = [s for state in saved for s in state["synchronizer"]["buckets"].values()]
        mapped = reshard_state([state["synchronizer"] for state in saved], 3)
        for name in saved[0]["synchronizer"]["buckets"]:
            old = [state["synchronizer"]["buckets"][name]["state"] for state in saved]
            new = [state["buckets"][name]["state"] for state in mapped]
            assert torch.allclose(
                pending_update(old, buffer), pending_update(new, buffer), rtol=1e-6, atol=1e-9
            ), (name, buffer)
        assert before
    resumed = run(3, tmp_path, "--max-epochs", "2", "--resume", "--method-option", "momentum=0.9")
    assert "resumed iteration 10 of a 4-rank run on 3 ranks; residuals resharded" in resumed.stdout
    final = states(tmp_path / "ckpt" / "epoch-0002", 3)
    assert all(
        torch.equal(final[0]["model"][key], other["model"][key])
        for other in final[1:]
        for key in final[0]["model"]
    )


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A 2-rank run of 8 iterations with a checkpoint every 3 (and one at the epoch's end)."""
    where = tmp_path_factory.mktemp("two-ranks")
    run(2, where, *TWO_RANKS)
    return where


TWO_RANKS = ["--max-epochs", "1", "--max-iters", "8", "--checkpoint-every", "3"]


def killed_copy(two_ranks, tmp_path):
    """A copy of the 2-rank run as if killed after iteration 6 (no end-of-epoch checkpoint)."""
    shutil.copytree(two_ranks / "ckpt", tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt" / "epoch-0001")


def test_two_ranks_go_on_on_four_keeping_the_global_batch(two_ranks, tmp_path):
    killed_copy(two_ranks, tmp_path)
    resumed = run(
        4, tmp_path, "--max-epochs", "1", "--max-iters", "8", "--resume", "--keep-global-batch"
    )
    assert "resumed iteration 6 of a 2-rank run on 4 ranks" in resumed.stdout
    assert "a global batch of 64, 16 per rank" in resumed.stderr
    assert (tmp_path / "ckpt" / "epoch-0001" / "WORLD").read_text() == "4\n"


def test_a_resume_within_an_epoch_at_the_same_world_size_is_bit_identical(two_ranks, tmp_path):
    killed_copy(two_ranks, tmp_path)
    resumed = run(2, tmp_path, *TWO_RANKS, "--resume")
    assert "resumed from the checkpoint of epoch 0 and 6 iterations of epoch 1" in resumed.stdout
    for rank in range(2):
        a, b = (
            torch.load(where / "ckpt" / "epoch-0001" / f"rank-{rank:04d}.pt", weights_only=True)
            for where in (two_ranks, tmp_path)
        )
        assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
        for name, entry in a["synchronizer"]["buckets"].items():
            again = b["synchronizer"]["buckets"][name]["state"]
            assert torch.equal(entry["state"]["residual"], again["residual"]), name


def test_checkpoint_every_needs_a_checkpoint_directory():
    result = mpiexec(1, "main_trainer.py", "--checkpoint-every", "5", timeout=60)
    assert result.returncode == 2 and "--checkpoint-every needs --checkpoint-dir" in result.stderr


def test_the_mpi_relaunch_loop_goes_on_on_fewer_ranks_after_a_killed_rank(tmp_path):
    # ATTEMPT_TIMEOUT: in two CI runs of 2026-12-07 the first attempt did not end after its
    # killed rank (not reproduced alone or under load). The loop now ends such an attempt and
    # goes on; the test still reports it, as a warning, so that it stays visible.
    env = dict(
        environment(),
        PYTHON=os.path.join(ROOT, "tests", "dying_python.sh"),
        REAL_PYTHON=sys.executable,
        MPIEXEC=command(1)[0],
        DYING_MARKER=str(tmp_path / "killed"),
        DYING_CHECKPOINTS=str(tmp_path / "ckpt"),
        ATTEMPT_TIMEOUT="90",
    )
    result = subprocess.run(
        [os.path.join(ROOT, "scripts", "elastic_mpi.sh"), "3 2"]
        + ["--checkpoint-dir", str(tmp_path / "ckpt"), "--max-epochs", "2", *FLAGS]
        + ["--checkpoint-every", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    if "had not ended after ATTEMPT_TIMEOUT" in result.stderr:
        warnings.warn(
            "the relaunch loop had to end an attempt that hung after its killed rank", stacklevel=1
        )
    assert (tmp_path / "killed").exists()
    assert "attempt 1 failed" in result.stderr and "relaunching on 2 ranks" in result.stderr
    assert "of a 3-rank run on 2 ranks; residuals resharded" in result.stdout
    assert (tmp_path / "ckpt" / "epoch-0002" / "WORLD").read_text() == "2\n"


def test_the_mpi_relaunch_loop_refuses_bad_input():
    script = os.path.join(ROOT, "scripts", "elastic_mpi.sh")
    for argv, message in (
        ([], "usage"),
        (["4 x"], "positive integers"),
        (["2"], "needs --checkpoint-dir"),
        (["2", "--checkpoint-dir", "x", "ATTEMPT_TIMEOUT=-1"], "ATTEMPT_TIMEOUT must be"),
    ):
        env = dict(os.environ, ATTEMPT_TIMEOUT="-1") if "ATTEMPT_TIMEOUT=-1" in argv else None
        result = subprocess.run(
            [script, *argv], capture_output=True, text=True, timeout=30, env=env
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_the_mpi_relaunch_loop_ends_an_attempt_that_hangs(tmp_path):
    """A launcher that never returns (here a fake one, the first time) is ended and relaunched."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        f"#!/usr/bin/env bash\n[ -e {tmp_path}/once ] && exit 0\ntouch {tmp_path}/once\n"
        "exec sleep 60\n"
    )
    fake.chmod(0o755)
    env = dict(os.environ, MPIEXEC=str(fake), ATTEMPT_TIMEOUT="1", RESTARTS="1")
    script = os.path.join(ROOT, "scripts", "elastic_mpi.sh")
    result = subprocess.run(
        [script, "2", "--checkpoint-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "attempt 1 had not ended after ATTEMPT_TIMEOUT=1 s; ended it" in result.stderr
    assert "attempt 1 failed (exit 124); relaunching on 2 ranks" in result.stderr
