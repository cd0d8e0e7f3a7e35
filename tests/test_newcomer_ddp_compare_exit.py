"""scripts/ddp_compare.py ends in order: when its main returns, the hooks' communication thread
has been joined and the process group destroyed, so nothing is left to run while Python exits
(a daemon thread left in torch at exit aborted 2 runs in 22: "terminate called without an
active exception")."""

import os
import socket
import subprocess
import sys

from tests.mpirun import ROOT

CHECK = """
import sys, threading
import torch.distributed as dist
from syncbench import ddp_compare
status = ddp_compare.main(sys.argv[1:])
print("initialized:", dist.is_initialized())
print("threads:", sorted(thread.name for thread in threading.enumerate()))
sys.exit(status)
"""


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_no_thread_and_no_process_group_outlive_main():
    env = dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT,
    )
    flags = ["--model", "resnet20", "--hooks", "compute,spardl,topk:wire=fp16"]
    result = subprocess.run(
        [sys.executable, "-c", CHECK, *flags, "--iters", "1", "--warmup", "1", "--batch-size", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| spardl |" in result.stdout and "| topk:wire=fp16 |" in result.stdout
    assert "initialized: False" in result.stdout
    assert "threads: ['MainThread']" in result.stdout
