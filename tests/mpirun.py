"""Spawn ``mpiexec`` or ``torchrun`` from tests, always with a timeout, with the settings for
oversubscription."""

import os
import shutil
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
    """The command line ``mpiexec -n workers python args...``.

    The ``mpiexec`` beside this Python (the one ``pip install mpich`` gives), else the first on
    the ``PATH``.
    """
    launcher = os.path.join(BIN, "mpiexec")
    if not os.path.exists(launcher):
        launcher = shutil.which("mpiexec") or launcher
    return [launcher, "-n", str(workers), sys.executable, *args]


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


def mpiexec_together(runs, timeout=240):
    """Start every ``(workers, args)`` of ``runs`` at once, as :func:`mpiexec` would run each;
    return their results in order (a run past ``timeout`` is killed, its return code nonzero).

    Independent runs overlap their start-up (imports, data) with each other's work."""
    started = [
        subprocess.Popen(
            command(workers, *args),
            cwd=ROOT,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for workers, args in runs
    ]
    results = []
    for process in started:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return results


def torchrun(workers, script, timeout=240):
    """Run ``torchrun --standalone --nproc-per-node workers script`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        + [f"--nproc-per-node={workers}", script],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class FirstOf:
    """Rank 0 of ``size`` as the trainer's command-line checks see a communicator: all agree."""

    def __init__(self, size: int) -> None:
        self.size = size

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.size

    def allgather(self, value):
        return [value] * self.size
