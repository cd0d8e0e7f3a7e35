"""The DDP hook and GradientBuckets over MPI under a real ``mpiexec``, overlapped with backward: the
bits of blocking calls for every method, and failures (Ctrl-C, divergence, a killed rank) that end
the job within seconds."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.mpirun import ROOT, command, environment, mpiexec

pytestmark = pytest.mark.mpi
SCRIPT = "tests/ddp_mpi_check.py"


@pytest.mark.parametrize("workers", [2, 3])
def test_overlapped_hook_gives_the_bits_of_the_blocking_one(workers):
    run = mpiexec(workers, SCRIPT, "check", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"ddp mpi checks passed on {workers} ranks" in run.stdout


def _started(mode):
    """Start ``mode`` on 2 ranks; return the process and the ranks' process ids once it trains."""
    process = subprocess.Popen(
        command(2, SCRIPT, mode),
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if not line.startswith("started"):
        process.kill()
        pytest.fail(f"did not start: {line!r} {process.communicate()}")
    time.sleep(0.5)  # in the middle of training: buckets in flight
    return process, [int(pid) for pid in line.split()[1:]]


def _ended(process, seconds=10):
    started = time.monotonic()
    try:
        stdout, stderr = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {seconds} s later: {process.communicate()}")
    return stdout, stderr, time.monotonic() - started


def test_ctrl_c_ends_every_rank_with_one_line_and_status_130():
    process, _ = _started("interrupt")
    process.send_signal(signal.SIGINT)
    stdout, stderr, _ = _ended(process)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "BAD TERMINATION" not in stdout
    # Rank 0 says so unless it was waiting inside an MPI call, where no signal reaches Python.
    assert stderr.strip() in ("interrupted", ""), stderr


def test_a_killed_rank_ends_the_job_within_seconds():
    process, pids = _started("kill")
    os.kill(pids[1], signal.SIGKILL)
    _, _, seconds = _ended(process)
    assert process.returncode != 0 and seconds < 10


def test_divergence_on_one_rank_ends_the_job_with_status_1():
    started = time.monotonic()
    run = mpiexec(2, SCRIPT, "diverge", timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "NaN or inf" in run.stderr and "[rank 1] uncaught exception" in run.stderr
    assert time.monotonic() - started < 60


def test_mpi_without_thread_support_is_one_clear_error():
    program = (
        "import mpi4py\n"
        "mpi4py.rc.thread_level = 'single'\n"
        "from mpi4py import MPI\n"
        "from compressors.ddp import SparDLState\n"
        "SparDLState(MPI.COMM_WORLD, density=0.1)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "RuntimeError: the overlapped bucket pipeline needs MPI_THREAD_SERIALIZED"
    )
    assert "MPI_THREAD_SINGLE" in last


@pytest.mark.parametrize("workers", [2, 3])
def test_gradient_buckets_give_the_bits_of_blocking_calls_under_mpiexec(workers):
    run = mpiexec(workers, "tests/buckets_mpi_check.py", "check", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"gradient buckets checks passed on {workers} ranks" in run.stdout


def test_ctrl_c_with_gradient_buckets_in_flight_ends_with_status_130():
    process = subprocess.Popen(
        command(2, "tests/buckets_mpi_check.py", "interrupt"),
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "started\n"
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    stdout, stderr, _ = _ended(process)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "BAD TERMINATION" not in stdout
    assert stderr.strip() in ("interrupted", ""), stderr
