"""Ctrl-C during training ends every rank within seconds: exit status 130, one line naming the
step and the last complete checkpoint, no traceback; with and without mpiexec."""

import signal
import subprocess
import sys
import time

import pytest

from tests.mpirun import ROOT, command, environment

pytestmark = pytest.mark.mpi


def _train_until_epoch_logged(argv, log_dir, timeout=120):
    """Start ``argv`` (a long run logging to ``log_dir``); return it once an epoch is logged."""
    process = subprocess.Popen(
        argv, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics, deadline = log_dir / "metrics.jsonl", time.monotonic() + timeout
    while not (metrics.is_file() and metrics.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"training did not log an epoch: {process.communicate()}")
        time.sleep(0.2)
    return process


@pytest.mark.parametrize("workers", [None, 4])
def test_ctrl_c_ends_every_rank_with_one_line_and_status_130(tmp_path, workers):
    flags = [
        "main_trainer.py",
        "--max-epochs",
        "1000",
        "--log-dir",
        str(tmp_path / "log"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    argv = command(workers, *flags) if workers else [sys.executable, *flags]
    process = _train_until_epoch_logged(argv, tmp_path / "log")
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    try:
        stdout, stderr = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running 10 s after SIGINT: {process.communicate()}")
    assert time.monotonic() - started < 10
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("main_trainer.py: interrupted at "), stderr
    assert f"; the last checkpoint is {tmp_path / 'ckpt'}/epoch-" in lines[0]
    epoch = int(lines[0].rsplit("epoch-", 1)[1])
    assert epoch >= 1 and (tmp_path / "ckpt" / f"epoch-{epoch:04d}").is_dir()


LIBRARY_PROGRAM = """
import sys, torch
from mpi4py import MPI
import compressors
sync = compressors.create("spardl", MPI.COMM_WORLD, numel=100_000, density=0.01)
if MPI.COMM_WORLD.Get_rank() == 0:  # one line: several ranks' could interleave
    print("started", flush=True)
while True:
    sync.allreduce(torch.randn(100_000))
"""


def test_ctrl_c_in_a_library_program_is_no_crash():
    """A program of the library's users gets the uncaught-exception hook with its first MPI
    synchronizer: Ctrl-C ends every rank with status 130 and at most one word, not an abort
    report with tracebacks, also when ranks wait inside MPI calls (8 ranks on this machine's
    cores: often some do)."""
    process = subprocess.Popen(
        command(8, "-c", LIBRARY_PROGRAM),
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "started\n"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 130, stdout + stderr
    assert (
        "Traceback" not in stderr and "aborting" not in stderr and "BAD TERMINATION" not in stdout
    )
    # Rank 0 says so unless it was waiting inside an MPI call, where no signal reaches Python.
    assert stderr.strip() in ("interrupted", ""), stderr
