"""Spawn ``mpiexec`` from tests, always with a timeout, with the settings for oversubscription."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def environment():
    """The environment of a spawned run: one thread per rank, waiting ranks yield the CPU."""
    path = os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MPIR_CVAR_POLLS_BEFORE_YIELD="1",
        MPIR_CVAR_ENABLE_HEAVY_YIELD="1",
        PYTHONPATH=path,
    )


def command(workers, *args):
    """The command line ``mpiexec -n workers python args...``."""
    return [os.path.join(BIN, "mpiexec"), "-n", str(workers), sys.executable, *args]


def mpiexec(workers, *args, timeout=240):
    """Run ``mpiexec -n workers python args...`` from the repository root; return the result."""
    return subprocess.run(
        command(workers, *args),
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
