"""scripts/shaped_network.sh: argument checks, the environment it gives its command, its exit
status, that MPI traffic really crosses the shaped link, and that the namespace never outlives it.

Shaping needs root, ``ip`` and ``tc``; those tests skip with the reason where they are missing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from mpirun import BIN, ROOT

SCRIPT = os.path.join(ROOT, "scripts", "shaped_network.sh")
needs_shaping = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="shaping a network namespace needs root and iproute2's ip and tc",
)
ENV = dict(
    os.environ,
    OMP_NUM_THREADS="1",
    MPIR_CVAR_POLLS_BEFORE_YIELD="1",
    MPIR_CVAR_ENABLE_HEAVY_YIELD="1",
    PYTHONPATH=ROOT,
)


def shaped(*args, env=ENV, timeout=60):
    return subprocess.run(
        [SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def namespaces():
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--rate is required"),
        (["--", "true"], "--rate is required"),
        (["--rate", "1gbyte", "--", "true"], "bad --rate '1gbyte'"),
        (["--rate", "fast", "--", "true"], "bad --rate 'fast'"),
        (["--rate", "1gbit", "--burst", "lots", "--", "true"], "bad --burst 'lots'"),
        (["--rate", "1gbit"], "no command given after --"),
        (["--rate", "1gbit", "true"], "unknown argument 'true' (the command goes after --)"),
        (["--rate"], "--rate needs a value"),
    ],
)
def test_bad_arguments_print_the_usage_and_exit_2(args, message):
    result = shaped(*args)
    assert result.returncode == 2 and result.stdout == ""
    first, usage = result.stderr.splitlines()[:2]
    assert first.startswith(f"shaped_network.sh: {message}") and usage.startswith(
        "usage: shaped_network.sh --rate"
    )


@needs_shaping
def test_the_command_sees_only_a_shaped_loopback_and_the_tcp_settings():
    env = dict(ENV, FI_PROVIDER="sockets", MPIR_CVAR_NOLOCAL="0")
    env.pop("MPIR_CVAR_CH4_NETMOD", None)
    probe = (
        "ip netns identify; ip -o link | cut -d: -f2; tc qdisc show dev lo; "
        "echo $SPARDL_NETWORK_RATE $MPIR_CVAR_NOLOCAL $MPIR_CVAR_CH4_NETMOD $FI_PROVIDER; exit 7"
    )
    result = shaped("--rate", "100mbit", "--burst", "128kb", "--", "sh", "-c", probe, env=env)
    assert result.returncode == 7, result.stderr  # the command's status
    name, link, qdisc, settings = result.stdout.splitlines()
    assert name.startswith("spardl-shaped-") and link.strip() == "lo"
    assert qdisc.startswith("qdisc tbf") and "rate 100Mbit" in qdisc and "lat 100ms" in qdisc
    assert settings == "100mbit 1 ofi sockets"  # the caller's provider kept; NOLOCAL always 1
    assert name not in namespaces()


@needs_shaping
def test_a_failing_start_leaves_no_namespace():
    result = shaped("--rate", "1gbit", "--", "sh", "-c", "ip netns identify; exec /nonexistent")
    assert result.returncode != 0
    assert result.stdout.split()[0] not in namespaces()


@needs_shaping
def test_sigint_reaches_the_command_and_the_namespace_goes():
    probe = (
        "import os, sys, time; print(os.popen('ip netns identify').read().strip(), flush=True); "
        "time.sleep(60)"
    )
    process = subprocess.Popen(
        [SCRIPT, "--rate", "1gbit", "--", sys.executable, "-c", probe],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        name = process.stdout.readline().strip()
        assert name in namespaces()
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 130 and "KeyboardInterrupt" in err  # Python's own SIGINT exit
    assert time.monotonic() - started < 10 and name not in namespaces()


@needs_shaping
@pytest.mark.mpi
def test_mpi_messages_cross_the_shaped_link():
    """2.5 MB at 100 Mbit/s takes 0.2 s; over shared memory or an unshaped loopback, ms."""
    result = shaped(
        "--rate",
        "100mbit",
        "--",
        os.path.join(BIN, "mpiexec"),
        "-n",
        "2",
        sys.executable,
        os.path.join(ROOT, "tests", "shaped_send.py"),
        "2500000",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seconds = float(result.stdout.split()[-1])
    assert 0.15 < seconds < 1.0, seconds


@needs_shaping
@pytest.mark.mpi
@pytest.mark.slow
def test_the_bench_runs_shaped_and_records_its_network(tmp_path):
    output = tmp_path / "bench.json"
    result = shaped(
        "--rate",
        "100mbit",
        "--",
        os.path.join(BIN, "mpiexec"),
        "-n",
        "2",
        sys.executable,
        os.path.join(ROOT, "scripts", "bench_allreduce.py"),
        "--numel",
        "20000",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--methods",
        "spardl,topk",
        "--json",
        str(output),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(output.read_text())
    assert rows and all(row["network"] == "100mbit" for row in rows), rows[0]


@needs_shaping
@pytest.mark.slow
def test_the_trainer_runs_shaped_and_its_rows_record_the_network(tmp_path):
    result = shaped(
        "--rate",
        "1gbit",
        "--",
        sys.executable,
        os.path.join(ROOT, "main_trainer.py"),
        "--max-epochs",
        "1",
        "--max-iters",
        "2",
        "--log-dir",
        str(tmp_path),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["network"] for row in rows] == ["1gbit"]
