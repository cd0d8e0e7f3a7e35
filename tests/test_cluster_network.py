"""scripts/cluster_network.sh: argument checks, the environment and network it gives its command,
its exit status, where the ranks run (rank r on host r // G), that traffic between hosts is held
to the links' rates while ranks of one host talk through shared memory, and that nothing it made
outlives it (namespaces, links, /etc/netns entries, processes).

Building the cluster needs root, ``ip`` and ``tc`` (iproute2) and ``unshare``; those tests skip
with the reason where they are missing. Times are only bounded from below: a busy machine makes
everything slower, never a shaped link faster.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from mpirun import BIN, ROOT, environment

SCRIPT = os.path.join(ROOT, "scripts", "cluster_network.sh")
PROBE = os.path.join(ROOT, "tests", "cluster_probe.py")
MPIEXEC = os.path.join(BIN, "mpiexec")
TORCHRUN = os.path.join(BIN, "torchrun")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("ip", "tc", "unshare")),
    reason="building the cluster's namespaces needs root, iproute2's ip and tc, and unshare",
)
ENV = environment()


def cluster(*args, env=ENV, timeout=60):
    """Run the script; the result's ``prefix`` is that of the names it made (its process id)."""
    process = subprocess.Popen(
        [SCRIPT, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    result.prefix = f"spardl-c{process.pid}-"
    return result


def namespaces():
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def links():
    listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip().split("@")[0] for line in listing.stdout.splitlines()}


def assert_nothing_left(prefix, links_before):
    """No namespace, /etc/netns entry or temporary folder of ``prefix``; no new link of ours."""
    assert re.fullmatch(r"spardl-c\d+-", prefix), prefix
    assert not {name for name in namespaces() if name.startswith(prefix)}
    assert not any(name.startswith(prefix) for name in os.listdir("/tmp"))
    if os.path.isdir("/etc/netns"):
        assert not any(name.startswith(prefix) for name in os.listdir("/etc/netns"))
    assert not {n for n in links() - links_before if re.fullmatch(r"h\d+|br0|eth0|veth.*", n)}


def running(pid):
    """Whether process ``pid`` exists and is not a zombie (dead, its parent yet to collect it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def probe_mpi(hosts, per_host, rate_args, nbytes=2_000_000):
    result = cluster(
        "--hosts",
        str(hosts),
        "--ranks-per-host",
        str(per_host),
        *rate_args,
        "--",
        MPIEXEC,
        "-n",
        str(hosts * per_host),
        sys.executable,
        PROBE,
        str(nbytes),
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--hosts is required"),
        (["--rate", "1gbit", "--", "true"], "--hosts is required"),
        (["--hosts"], "--hosts needs a value"),
        (["--hosts", "0", "--rate", "1gbit", "--", "true"], "bad --hosts '0'"),
        (["--hosts", "two", "--rate", "1gbit", "--", "true"], "bad --hosts 'two'"),
        (["--hosts", "251", "--rate", "1gbit", "--", "true"], "bad --hosts '251'"),
        (["--hosts", "2", "--", "true"], "--rate or --rates is required"),
        (["--hosts", "2", "--rate", "fast", "--", "true"], "bad rate 'fast'"),
        (["--hosts", "2", "--rates", "1gbit,2gbyte", "--", "true"], "bad rate '2gbyte'"),
        (["--hosts", "3", "--rates", "1gbit,1gbit", "--", "true"], "bad --rates '1gbit,1gbit'"),
        (["--hosts", "2", "--rates", "1gbit,1gbit,", "--", "true"], "bad --rates '1gbit,1gbit,'"),
        (
            ["--hosts", "2", "--rate", "1gbit", "--rates", "1gbit,1gbit", "--", "true"],
            "give --rate or --rates, not both",
        ),
        (
            ["--hosts", "2", "--ranks-per-host", "0", "--rate", "1gbit", "--", "true"],
            "bad --ranks-per-host '0'",
        ),
        (["--hosts", "2", "--rate", "1gbit", "--burst", "lots", "--", "true"], "bad --burst"),
        (["--hosts", "2", "--rate", "1gbit", "--delay", "5", "--", "true"], "bad --delay '5'"),
        (["--hosts", "2", "--rate", "1gbit"], "no command given after --"),
        (["--hosts", "2", "--rate", "1gbit", "true"], "unknown argument 'true'"),
    ],
)
def test_bad_arguments_print_the_usage_and_exit_2(args, message):
    result = cluster(*args)
    assert result.returncode == 2 and result.stdout == ""
    first, usage = result.stderr.splitlines()[:2]
    assert first.startswith(f"cluster_network.sh: {message}"), first
    assert usage.startswith("usage: cluster_network.sh --hosts N")


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop it (setpriv)"
)
def test_without_root_one_message_and_exit_2():
    # A copy the unprivileged user can reach: a clone may lie in a folder only root may enter
    # (``mktemp -d`` makes them 0700), where the script would not even start (status 126).
    folder = tempfile.mkdtemp()
    try:
        os.chmod(folder, 0o755)
        script = shutil.copy(SCRIPT, folder)
        os.chmod(script, 0o755)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", script]
            + ["--hosts", "2", "--rate", "1gbit", "--", "true"],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "cluster_network.sh: needs root to create and shape network namespaces (run it with sudo)"
    ]


def netem_available():
    name = f"spardl-cnetem-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        tc = ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem"]
        return (
            subprocess.run(tc + ["delay", "1ms"], capture_output=True, timeout=30).returncode == 0
        )
    finally:
        subprocess.run(["ip", "netns", "delete", name], timeout=30)


@needs_root
def test_delay_without_netem_is_refused_with_one_message():
    if netem_available():
        pytest.skip("this kernel has netem: --delay works here")
    before = links()
    result = cluster("--hosts", "2", "--rate", "1gbit", "--delay", "2ms", "--", "true")
    assert result.returncode == 2 and result.stdout == ""
    [message] = result.stderr.splitlines()
    assert message.startswith("cluster_network.sh: --delay needs tc's netem qdisc"), message
    assert_nothing_left(result.prefix, before)


@needs_root
def test_delay_with_netem_delays_and_is_recorded():
    if not netem_available():
        pytest.skip("this kernel lacks netem (sch_netem): --delay is refused")
    probe = (
        'ip netns exec "$(ip netns identify | sed s/-sw$/-h0/)" tc qdisc; echo "$SPARDL_CLUSTER"'
    )
    result = cluster("--hosts", "2", "--rate", "1gbit", "--delay", "2ms", "--", "sh", "-c", probe)
    assert result.returncode == 0, result.stderr
    assert "netem" in result.stdout and "delay 2ms" in result.stdout
    assert json.loads(result.stdout.splitlines()[-1])["delay"] == "2ms"


@needs_root
def test_the_command_runs_on_the_switch_with_the_cluster_settings():
    env = dict(ENV, FI_PROVIDER="sockets")
    env.pop("MPIR_CVAR_CH4_NETMOD", None)
    probe = (
        "ip netns identify; ip -o link | cut -d: -f2 | cut -d@ -f1 | tr -d ' ' | sort | xargs; "
        "tc qdisc show | grep tbf | sort; "
        'for i in 0 1 2; do ip netns exec "$(ip netns identify | sed s/-sw$//)-h$i" '
        "sh -c 'ip -br -4 addr show dev eth0; tc qdisc show dev eth0'; done; "
        "echo $SPARDL_NETWORK_RATE $MPIR_CVAR_CH4_NETMOD $FI_PROVIDER $FI_TCP_IFACE "
        "$GLOO_SOCKET_IFNAME $HYDRA_LAUNCHER $HYDRA_IFACE; cat $HYDRA_HOST_FILE | xargs; "
        "echo $HYDRA_HOST_FILE; echo $SPARDL_CLUSTER; exit 7"
    )
    before = links()
    result = cluster(
        "--hosts",
        "3",
        "--ranks-per-host",
        "2",
        "--rates",
        "1gbit,500kbit,2mbps",
        "--",
        "sh",
        "-c",
        probe,
        env=env,
    )
    assert result.returncode == 7, result.stderr  # the command's status
    lines = result.stdout.splitlines()
    name = lines[0]
    assert name.startswith(result.prefix) and name.endswith("-sw")
    assert lines[1] == "br0 h0 h1 h2 lo"  # the switch: a bridge and one port per host
    switch_side = lines[2:5]
    assert all(line.startswith("qdisc tbf 1: dev h") for line in switch_side)
    assert ["rate 1Gbit" in switch_side[0], "rate 500Kbit" in switch_side[1]] == [True, True]
    assert "rate 16Mbit" in switch_side[2] and "burst 256Kb" in switch_side[2]
    for host, rate in enumerate(["1Gbit", "500Kbit", "16Mbit"]):
        address, qdisc = lines[5 + 2 * host : 7 + 2 * host]
        assert address.split()[-1] == f"169.254.77.{host + 1}/24"
        assert qdisc.startswith("qdisc tbf 1: root") and f"rate {rate}" in qdisc
    settings, hostfile, hostfile_path, topology = lines[11:15]
    assert settings == "500kbit ofi sockets eth0 eth0 ssh br0"  # the caller's provider kept
    assert hostfile == "169.254.77.1:2 169.254.77.2:2 169.254.77.3:2"
    assert json.loads(topology) == {
        "hosts": 3,
        "ranks_per_host": 2,
        "rates": ["1gbit", "500kbit", "2mbps"],
        "delay": None,
    }
    assert not os.path.exists(hostfile_path)
    assert_nothing_left(result.prefix, before)


@needs_root
def test_a_failing_command_leaves_no_namespace_and_no_process():
    before = links()
    started = time.monotonic()
    result = cluster(
        "--hosts", "2", "--rate", "1gbit", "--", "sh", "-c", "ip netns identify; sleep 60 & exit 3"
    )
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 30  # the stray sleep was killed, not waited for
    assert result.stdout.startswith(result.prefix)
    assert_nothing_left(result.prefix, before)


@needs_root
def test_sigterm_reaches_the_command_and_everything_goes():
    probe = (
        "import os, time; print(os.popen('ip netns identify').read().strip(), flush=True); "
        "time.sleep(60)"
    )
    before = links()
    process = subprocess.Popen(
        [SCRIPT, "--hosts", "2", "--rate", "1gbit", "--", sys.executable, "-c", probe],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        name = process.stdout.readline().strip()
        assert name in namespaces()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM  # the command's death, passed through
    assert_nothing_left(f"spardl-c{process.pid}-", before)


@needs_root
@pytest.mark.mpi
def test_sigint_reaches_the_ranks_on_every_host_and_everything_goes():
    probe = (  # rank 0 prints [[pid, namespace], ...] of both ranks, then both sleep
        "import json, os, time; from mpi4py import MPI; "
        "name = os.popen('ip netns identify').read().strip(); "
        "ranks = MPI.COMM_WORLD.gather([os.getpid(), name]); "
        "print(json.dumps(ranks), flush=True) if ranks else None; time.sleep(60)"
    )
    before = links()
    process = subprocess.Popen(
        [SCRIPT, "--hosts", "2", "--rate", "1gbit", "--"]
        + [MPIEXEC, "-n", "2", sys.executable, "-c", probe],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ranks = dict(json.loads(process.stdout.readline()))
        assert sorted(name[-3:] for name in ranks.values()) == ["-h0", "-h1"]
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode != 0 and err.count("KeyboardInterrupt") == 2, err[-2000:]
    assert not any(running(pid) for pid in ranks)
    assert all(name.startswith(f"spardl-c{process.pid}-") for name in ranks.values())
    assert_nothing_left(f"spardl-c{process.pid}-", before)


@needs_root
@pytest.mark.mpi
def test_two_hosts_one_rank_each_and_the_receiving_link_is_shaped():
    """Host 0 sends at 1 Gbit/s; the switch hands host 1 its 2 MB at 20 Mbit/s: 0.7 s at least."""
    result = probe_mpi(2, 1, ["--rates", "1gbit,20mbit"])
    ranks = result["ranks"]
    assert [rank["hostname"] for rank in ranks] == ["host0", "host1"]
    assert [rank["address"] for rank in ranks] == ["169.254.77.1", "169.254.77.2"]
    assert ranks[0]["netns"] != ranks[1]["netns"]
    assert result["seconds"][1] > 0.5, result


@needs_root
@pytest.mark.mpi
def test_two_hosts_two_ranks_each_shared_memory_within_shaped_between():
    """Rank r on host r // 2; 2 MB from host 0 at 20 Mbit/s: 0.7 s at least, within host 0 ms."""
    result = probe_mpi(2, 2, ["--rate", "20mbit"])
    ranks = result["ranks"]
    assert [rank["processor"] for rank in ranks] == ["host0", "host0", "host1", "host1"]
    assert [rank["address"] for rank in ranks] == ["169.254.77.1"] * 2 + ["169.254.77.2"] * 2
    assert [rank["local_size"] for rank in ranks] == ["2"] * 4
    assert ranks[0]["netns"] == ranks[1]["netns"] != ranks[2]["netns"] == ranks[3]["netns"]
    within, *between = result["seconds"][1:]
    assert all(seconds > 0.5 for seconds in between), result
    assert within < min(between), result  # shared memory, not the link
    assert json.loads(result["cluster"]) == {
        "hosts": 2,
        "ranks_per_host": 2,
        "rates": ["20mbit", "20mbit"],
        "delay": None,
    }
    assert result["network"] == "20mbit"


@needs_root
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed")
def test_torchrun_runs_once_per_host_with_gloo_over_the_links():
    result = cluster(
        "--hosts",
        "2",
        "--rate",
        "20mbit",
        "--",
        TORCHRUN,
        os.path.join(ROOT, "tests", "cluster_gloo.py"),
        "2000000",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    ranks = report["ranks"]
    assert [(rank["hostname"], rank["local_rank"]) for rank in ranks] == [
        ("host0", 0),
        ("host1", 0),
    ]
    assert ranks[0]["netns"] != ranks[1]["netns"] and ranks[0]["world_size"] == 2
    assert report["seconds"] > 0.5, report
