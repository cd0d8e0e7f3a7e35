"""Spawn ``mpiexec`` from tests, always with a timeout, with the settings for oversubscription."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def mpiexec(workers, *args, timeout=240):
    """Run ``mpiexec -n workers python args...`` from the repository root; return the result."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1",
               MPIR_CVAR_ENABLE_HEAVY_YIELD="1", PYTHONPATH=ROOT)
    launcher = os.path.join(BIN, "mpiexec")
    command = [launcher, "-n", str(workers), sys.executable, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
