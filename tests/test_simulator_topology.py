"""The simulator's cluster model: each message on the links it crosses, by hand."""

import json

import numpy as np
import pytest
import torch
from entry_points import load_script

from allreducers.transports.recording import Event
from syncbench import simulator
from syncbench.network import Cluster, Network, SharedLink, cluster_network, parse_topology
from syncbench.selection_cost import SelectionCost

simulate = load_script("simulate")

RATE = 125e6  # 1 Gbit/s in bytes/s
ALPHA, SHM_ALPHA, SHM_RATE = 100e-6, 10e-6, 1e9


def two_by_two(rates=(RATE,)):
    """2 hosts of 2 ranks: ranks 0, 1 on host 0 and ranks 2, 3 on host 1."""
    return Cluster("c", tuple(rates), 2, 2, ALPHA, SHM_ALPHA, SHM_RATE)


def seconds(network, *messages, workers=4):
    """One round's seconds of ``messages``, each ``(sender, receiver, bytes)``."""
    count, sent = np.zeros((1, workers, workers)), np.zeros((1, workers, workers))
    for sender, receiver, nbytes in messages:
        count[0, sender, receiver] += 1
        sent[0, sender, receiver] += nbytes
    return float(network.traffic_seconds(count, sent)[0])


def test_messages_sharing_a_link_share_its_rate():
    cluster = two_by_two()
    one = seconds(cluster, (0, 2, 1e6))
    assert one == pytest.approx(ALPHA + 1e6 / RATE, rel=1e-12)
    # both ranks of host 0 send to host 1: host 0's uplink carries twice the bytes
    assert seconds(cluster, (0, 2, 1e6), (1, 3, 1e6)) == pytest.approx(
        ALPHA + 2e6 / RATE, rel=1e-12
    )
    # the same two messages into one host's downlink, from different hosts: twice too
    three_hosts = Cluster("c", (RATE,), 1, 3, ALPHA, SHM_ALPHA, SHM_RATE)
    assert seconds(three_hosts, (0, 2, 1e6), (1, 2, 1e6), workers=3) == pytest.approx(
        ALPHA + 2e6 / RATE, rel=1e-12
    )
    # each way between the two hosts has links of its own: no sharing
    assert seconds(cluster, (0, 2, 1e6), (2, 0, 1e6)) == pytest.approx(one, rel=1e-12)


def test_messages_within_a_host_cost_shared_memory_only():
    cluster = two_by_two()
    assert seconds(cluster, (0, 1, 1e6)) == pytest.approx(SHM_ALPHA + 1e6 / SHM_RATE, rel=1e-12)
    # one host's shared memory is shared by its ranks; the other host's is its own
    assert seconds(cluster, (0, 1, 1e6), (1, 0, 1e6), (2, 3, 1e6)) == pytest.approx(
        SHM_ALPHA + 2e6 / SHM_RATE, rel=1e-12
    )
    # a rank sending within and between hosts pays both per-message costs
    assert seconds(cluster, (0, 1, 1e3), (0, 2, 1e6)) == pytest.approx(
        ALPHA + SHM_ALPHA + 1e6 / RATE, rel=1e-12
    )


def test_each_host_has_its_own_rate_and_a_transfer_runs_at_the_slower():
    slow_first = two_by_two((RATE / 10, RATE))
    slow = ALPHA + 1e6 / (RATE / 10)
    assert seconds(slow_first, (0, 2, 1e6)) == pytest.approx(slow, rel=1e-12)  # slow uplink
    assert seconds(slow_first, (2, 0, 1e6)) == pytest.approx(slow, rel=1e-12)  # slow downlink
    four = Cluster("c", (RATE / 10, RATE, RATE, RATE), 1, 4, ALPHA, SHM_ALPHA, SHM_RATE)
    assert seconds(four, (1, 2, 1e6), (2, 3, 1e6)) == pytest.approx(ALPHA + 1e6 / RATE, rel=1e-12)


def test_placement_wraps_around_the_hosts_and_hosts_follow_p_when_left_out():
    assert Cluster("c", (RATE,), 2, 2).placement(6).tolist() == [0, 0, 1, 1, 0, 0]
    assert Cluster("c", (RATE,), 4).placement(8).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert Cluster("c", (RATE,), 4).host_count(9) == 3


def test_an_allreduce_follows_recursive_halving_then_doubling():
    steps = simulator.allreduce_steps(0, 4, 4)
    assert [peer for peer, _ in steps] == [1, 2, 2, 1]
    assert [share for _, share in steps] == pytest.approx([1 / 3, 1 / 6, 1 / 6, 1 / 3])
    assert simulator.allreduce_steps(1, 3, 2) == [(2, 0.5), (2, 0.5)]  # a ring otherwise
    records = [
        {"rounds": 4, "events": [Event("allreduce", 0, None, 6000, torch.float32, rounds=4)]}
        for _ in range(4)
    ]
    # 4 hosts of one rank: per round each rank sends its share to another host, one per link
    count, sent = simulator.traffic_between(records)
    assert sent[:, 0].sum() == 6000 and sent[0, 0, 1] == 2000 and sent[1, 0, 2] == 1000
    own = Cluster("c", (RATE,), 1, 4, ALPHA, SHM_ALPHA, SHM_RATE)
    assert simulator.network_seconds(records, own, 2.0) == pytest.approx(
        4 * ALPHA + 2 * 6000 / RATE, rel=1e-12
    )


def test_one_rank_per_host_is_the_alpha_beta_network_for_spardl():
    """SparDL's rounds pair every rank with one sender and one receiver: own links, exactly."""
    per_rank = simulator.record_calls("spardl", {}, 4, 4096, 0.05, 2, warmup=1)
    records = [r[1] for r in per_rank]
    cluster = Cluster("c", (RATE,), 1, 4, ALPHA, SHM_ALPHA, SHM_RATE)
    cost = SelectionCost(0.05, rate=1e9)
    assert simulator.predict_call(records, cluster, 3.0, cost) == pytest.approx(
        simulator.predict_call(records, Network("own", ALPHA, 1 / RATE), 3.0, cost), rel=1e-12
    )
    # the models without per-message traffic are priced as before, rank by rank
    shared = SharedLink("s", ALPHA, RATE, 2)
    messages, sent = simulator.traffic_per_round(records)
    assert simulator.network_seconds(records, shared, 3.0) == pytest.approx(
        float(shared.round_seconds(messages, sent * 3.0).sum()), rel=1e-12
    )


def test_topologies_are_read_as_spardl_cluster_writes_them():
    written = {"hosts": 4, "ranks_per_host": 1, "rates": ["100mbit", "1gbit", "1gbit", "1gbit"]}
    cluster = cluster_network(dict(written, delay="1ms"), 160e-6, 2, 5e-6, 3e9)
    assert cluster == Cluster(
        "cluster:4x1@100mbit,1gbit,1gbit,1gbit",
        (12.5e6, RATE, RATE, RATE),
        1,
        4,
        pytest.approx(1160e-6),
        5e-6,
        3e9,
        2,
    )
    assert cluster.topology(4) == {
        "hosts": 4,
        "ranks_per_host": 1,
        "rates": ["100mbit", "1gbit", "1gbit", "1gbit"],
    }
    assert parse_topology(json.dumps({"ranks_per_host": 8, "rates": ["10gbit"]}))["hosts"] is None
    for bad, message in (
        ("[1]", "need an object"),
        ('{"hosts": 0, "rates": ["1gbit"]}', "hosts must be"),
        ('{"hosts": 3, "rates": ["1gbit", "1gbit"]}', "2 rates for 3 hosts"),
        ('{"hosts": 2, "rates": ["fast"]}', "is not a rate"),
        ('{"hosts": 2, "rates": ["1gbit"], "delay": "soon"}', "is not a delay"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_topology(bad)


def test_the_command_line_simulates_and_compares_on_a_cluster(tmp_path, capsys):
    common = ["--numel", "4096", "--model-numel", "30000", "--methods", "spardl,dense"]
    rows, _ = simulate.main(
        ["--workers", "4", *common, "--hosts", "2", "--ranks-per-host", "2", "--rates", "1gbit"]
    )
    assert {r["network"] for r in rows} == {"cluster:2x2@1gbit"}  # no presets beside it
    assert rows[0]["topology"] == {"hosts": 2, "ranks_per_host": 2, "rates": ["1gbit"] * 2}
    topology = {"hosts": 2, "ranks_per_host": 2, "rates": ["1gbit", "1gbit"], "delay": None}
    again, _ = simulate.main(["--workers", "4", *common, "--topology", json.dumps(topology)])
    assert [r["predicted_ms"] for r in again] == [r["predicted_ms"] for r in rows]
    bench = {
        "method": "spardl",
        "label": "spardl",
        "workers": 4,
        "numel": 30000,
        "density": 0.01,
        "median_ms": 2.0,
        "network": "1gbit",
        "topology": topology,
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([bench, dict(bench, topology=None)]))
    compared, _ = simulate.main(["--compare", str(path), "--numel", "4096"])
    assert [r["network"] for r in compared] == ["cluster:2x2@1gbit", "shared:1gbit"]
    assert (
        compared[0]["predicted_ms"]
        == [r for r in rows if r["method"] == "spardl"][0]["predicted_ms"]
    )
    capsys.readouterr()
    for argv, message in (
        (["--hosts", "2"], "--hosts and --ranks-per-host need --rates"),
        (["--rates", "1gbit,1gbit"], "give --hosts too"),
        (["--hosts", "2", "--rates", "1gbit,1gbit,1gbit"], "3 rates for 2 hosts"),
        (["--topology", "{}", "--rates", "1gbit"], "give one of them"),
        (["--topology", "nope"], "is not JSON"),
        (["--rates", "1gbit", "--shm-rate", "quick"], "is not a rate"),
    ):
        with pytest.raises(SystemExit) as exit_:
            simulate.main(["--workers", "4", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
