"""examples/elastic_ddp.py under two torchrun agents of 2 workers each on a loopback c10d
rendezvous: one agent and its workers are killed mid-run, and the other agent's workers go on
at world size 2 from the newest checkpoint, the hook's error feedback resharded from 4 ranks.

Also one agent whose worker kills itself: the agent restarts both workers (the restart that
failed with the hook before the rendezvous store was kept per round: docs/ELASTIC.md)."""

import glob
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.mpirun import ROOT, environment

pytestmark = [pytest.mark.slow]

RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _agent(port, directory, log, *extra, nnodes="1:2"):
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes]
    command += ["--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "test"]
    command += ["--rdzv-conf", RDZV_CONF, os.path.join(ROOT, "examples", "elastic_ddp.py")]
    command += ["--checkpoint-dir", str(directory), *extra]
    env = dict(environment(), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _kill_with_workers(agent) -> None:
    """SIGKILL ``agent`` and its workers (torchrun starts them in sessions of their own)."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(agent.pid):
            os.kill(int(stat.split("/")[2]), signal.SIGKILL)
    os.killpg(agent.pid, signal.SIGKILL)


def _wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.2)


@pytest.mark.timeout(400)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_survivors_go_on_at_world_size_two_when_one_agent_dies(tmp_path):
    port, directory = _free_port(), tmp_path / "ckpt"
    flags = ["--steps", "900", "--checkpoint-every", "100"]
    survivor = _agent(port, directory, open(tmp_path / "a.out", "w"), *flags)
    agents = [survivor]
    try:

        def listening():
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                return True
            except OSError:
                return False

        _wait_for(listening, 120, "rendezvous store")  # the first agent hosts it
        agents.append(_agent(port, directory, open(tmp_path / "b.out", "w"), *flags))
        checkpoint = directory / "step-000300" / "WORLD"
        _wait_for(checkpoint.is_file, 180, "checkpoint of step 300")
        assert checkpoint.read_text() == "4\n"
        _kill_with_workers(agents[1])
        killed = time.time()
        assert survivor.wait(240) == 0, (tmp_path / "a.out").read_text()[-3000:]
    finally:
        for agent in agents:
            if agent.poll() is None:
                _kill_with_workers(agent)
    lines = [line for line in open(tmp_path / "a.out") if line.startswith("elastic_ddp:")]
    resumed = [line for line in lines if "of a 4-rank run on 2 ranks" in line]
    assert len(resumed) == 1 and "finished step 900 on 2 ranks" in lines[-1], lines
    again = float(resumed[0].split(" at ")[1].split(",")[0])
    assert again - killed < 60, f"{again - killed:.1f} s from the death to training again"


@pytest.mark.timeout(300)
def test_one_agent_restarts_its_workers_with_the_hook_after_one_dies(tmp_path):
    log = open(tmp_path / "out", "w")
    flags = ["--steps", "60", "--checkpoint-every", "10", "--die-at-step", "25"]
    agent = _agent(_free_port(), tmp_path / "ckpt", log, *flags, nnodes="1")
    try:
        assert agent.wait(240) == 0, (tmp_path / "out").read_text()[-3000:]
    finally:
        if agent.poll() is None:
            _kill_with_workers(agent)
    lines = [line for line in open(tmp_path / "out") if line.startswith("elastic_ddp:")]
    assert "resumed step 20 of a 2-rank run on 2 ranks" in lines[1], lines
    assert "s after a worker died" in lines[1] and "finished step 60" in lines[-1]
