"""The scale simulator: counts equal mpiexec's, the network model by hand, P = 64 runs quickly."""

import json
import os
import re
import time

import pytest
import torch
from entry_points import load_script
from mpirun import mpiexec

import compressors
from allreducers.transports.recording import Event
from syncbench import predictions, simulator
from syncbench.floor import FLOORS
from syncbench.gradients import SyntheticGradients
from syncbench.network import Network, SharedLink, parse_network, parse_rate
from syncbench.selection_cost import SelectionCost, SelectionCounter
from syncbench.summary import summarize_counts

simulate = load_script("simulate")

COUNT_KEYS = ("bytes_per_rank", "bytes_max_rank", "messages", "rounds", "host_syncs", "nnz")


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [3, 4])
def test_counts_equal_those_under_mpiexec(workers, tmp_path):
    numel, density, warmup, iters, seed = 4099, 0.03, 1, 2, 5
    path = tmp_path / "rows.json"
    result = mpiexec(
        workers,
        os.path.join("scripts", "bench_allreduce.py"),
        "--numel",
        str(numel),
        "--density",
        str(density),
        "--warmup",
        str(warmup),
        "--iters",
        str(iters),
        "--seed",
        str(seed),
        "--teams",
        f"1,{workers}",
        "--json",
        str(path),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [row for row in json.loads(path.read_text()) if row["method"] not in FLOORS]
    assert {row["method"] for row in rows} == set(compressors.available())
    for row in rows:
        per_rank = simulator.record_calls(
            row["method"],
            {"teams": row["teams"]} if row["method"] == "spardl" else {},
            workers,
            numel,
            density,
            warmup + iters,
            seed,
        )
        counts = summarize_counts([records[warmup:] for records in per_rank])
        assert counts == {key: row[key] for key in COUNT_KEYS}, row["label"]


def test_the_log_adds_up_to_the_traffic_counts():
    for method in compressors.available():
        for records in simulator.record_calls(method, {}, 5, 3000, 0.05, 2):
            for record in records:
                counted = [e for e in record["events"] if e.round < record["rounds"]]
                sends = [e for e in counted if e.kind != "recv"]
                assert sum(e.nbytes for e in sends) == record["bytes"], method
                assert sum(e.rounds for e in sends) == record["messages"], method


def test_network_model_by_hand():
    alpha, beta = 2.0, 0.5
    network = Network("toy", alpha, beta)
    int32 = torch.int32
    rank0 = {
        "rounds": 3,
        "selections": {"topk": [100], "above": []},
        "events": [
            Event("send", 0, 1, 8, int32),
            Event("send", 0, 1, 4, int32),
            Event("allreduce", 1, None, 12, torch.float32, rounds=2),
            Event("send", 3, 1, 1000, int32),
        ],
    }  # round 3 is not counted: ignored
    rank1 = {
        "rounds": 3,
        "selections": {"topk": [], "above": [300]},
        "events": [
            Event("send", 0, 0, 20, int32),
            Event("recv", 0, 0, 12, int32),
            Event("allreduce", 1, None, 12, torch.float32, rounds=2),
        ],
    }
    cost = SelectionCost(0.01, threads=1, rate=100.0)
    predicted = simulator.predict_call([rank0, rank1], network, 2.0, cost)
    # round 0: max(2 alpha + 2*12 beta, alpha + 2*20 beta) = 22; rounds 1, 2: alpha + 2*6 beta = 8
    assert predicted["network"] == pytest.approx(22 + 8 + 8)
    # selection: the slower rank scans 2 * 300 elements at 100 per second
    assert predicted["select"] == pytest.approx(6.0)
    assert predicted["total"] == pytest.approx(44.0)


class _Periodic:
    """A stand-in synchronizer whose calls alternate between kinds, like Ok-Topk's schedule."""

    def __init__(self, period, kind_of):
        self.kind_period, self.call_kind = period, kind_of


def test_call_weights_price_each_kind_of_call_at_its_share_of_the_period():
    alike = _Periodic(1, lambda step: ())
    assert simulator.call_weights(alike, 1, 3) == [0.0, 0.5, 0.5]
    assert simulator.call_weights(alike, 0, 1) == [1.0]

    # Ok-Topk's defaults: calls 0 and 32 exact, 0 also re-splits; only calls 0 and 1 recorded
    def oktopk(step):
        return step % 32 == 0, step % 64 == 0, step % 32 == 0

    assert simulator.call_weights(_Periodic(64, oktopk), 1, 2) == pytest.approx([2 / 64, 62 / 64])
    every_third = _Periodic(3, lambda step: step % 3 == 0)
    assert simulator.call_weights(every_third, 1, 6) == pytest.approx(
        [0, 1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6]
    )
    assert simulator.call_weights(every_third, 0, 1) == [
        1.0
    ]  # nothing else recorded: call 0 stands in


def test_oktopk_kinds_follow_its_intervals():
    records = simulator.record_calls(
        "oktopk",
        {"local_interval": 2, "global_interval": 2, "region_interval": 4},
        workers=2,
        numel=20_000,
        density=0.01,
        calls=5,
        warmup=1,
    )
    weights = [record["weight"] for record in records[0]]
    assert weights == pytest.approx([0, 1 / 4, 1 / 4, 1 / 4, 1 / 4])  # calls 2, 4 exact; 1, 3 reuse
    exact = [
        sum(record["selections"]["topk"] + record["selections"]["hinted"]) >= 20_000
        for record in records[0]
    ]
    assert exact == [True, False, True, False, True]


def test_scanned_elements_are_weighted_like_the_prediction():
    """Ok-Topk's reported scan per rank counts its exact call at its share, as the time does."""
    rows, _ = simulate.main(
        [
            "--workers",
            "2",
            "--numel",
            "20000",
            "--methods",
            "oktopk",
            "--select-rate",
            "1e9",
            "--network",
            "ethernet",
        ]
    )
    per_rank = simulator.record_calls("oktopk", {}, 2, 20000, 0.01, 2, warmup=1)
    scans = [
        [sum(map(sum, record["selections"].values())) for record in records] for records in per_rank
    ]
    expected = sum(2 / 64 * calls[0] + 62 / 64 * calls[1] for calls in scans) / 2
    assert scans[0][0] != scans[0][1]  # the exact call scans differently
    assert rows[0]["scanned_per_rank"] == pytest.approx(expected)


def test_the_prediction_is_the_weighted_mean_of_the_calls():
    network = Network("toy", 1.0, 0.0)
    cost = SelectionCost(0.01, threads=1, rate=1.0)

    def call(length, weight):
        return {
            "rounds": 1,
            "events": [],
            "selections": {"topk": [length], "above": []},
            "weight": weight,
        }

    predicted = simulator.predict([[call(10, 0.25), call(2, 0.75)]], network, 1.0, cost)
    assert predicted["select"] == pytest.approx(0.25 * 10 + 0.75 * 2)
    assert predicted["network"] == pytest.approx(1.0)


def test_crossovers_compare_each_spardl_run_with_the_other_methods():
    def row(label, workers, ms):
        return {
            "network": "toy",
            "label": label,
            "method": label.split("(")[0],
            "workers": workers,
            "predicted_ms": ms,
        }

    rows = [
        row("spardl", 16, 5.0),
        row("spardl", 64, 3.0),
        row("spardl(d=4)", 16, 6.0),
        row("spardl(d=4)", 64, 1.0),
        row("oktopk", 16, 4.0),
        row("oktopk", 64, 2.0),
    ]
    assert predictions.crossovers(rows) == [
        "toy: spardl vs oktopk: faster at P=none, slower at P=[16, 64]"
    ]
    assert predictions.crossovers(rows, "spardl(d=4)") == [
        "toy: spardl(d=4) vs oktopk: faster at P=[64], slower at P=[16]; crossover between P 16->64"
    ]


def test_an_exact_tie_is_called_a_tie_not_a_win():
    rows = [
        {
            "network": "toy",
            "label": label,
            "method": label,
            "workers": 4,
            "predicted_ms": ms,
            "model_numel": 100,
            "density": 0.01,
        }
        for label, ms in (("spardl", 2.0), ("topk", 2.0), ("dense", 3.0))
    ]
    table = predictions.format_tables(rows, "predicted_ms", "ms", {"toy": "a toy"})
    assert table.splitlines()[-1].endswith("tie: spardl, topk")
    assert predictions.crossovers(rows) == [
        "toy: spardl vs topk: faster at P=none, slower at P=none, tied at P=[4]",
        "toy: spardl vs dense: faster at P=[4], slower at P=none",
    ]
    rows[1]["predicted_ms"] = 2.5
    table = predictions.format_tables(rows, "predicted_ms", "ms", {"toy": "a toy"})
    assert table.splitlines()[-1].endswith("spardl")


def test_selection_counter_logs_outer_calls_once():
    selector = compressors.Selector()
    x = SyntheticGradients(100_000, 0).get(0, 0)
    with SelectionCounter() as counter:
        selector.topk(x, 100)  # calls topk_rows() internally
        selector.topk_rows(x.view(4, -1), 10)  # a matrix: its first row, then 3 further rows
        selector.above(x.abs(), 1.0)
        selector.take(x.clone().view(2, -1), 10)  # through scan: a row and a further row
        selector.at_least(x, 1.0)
        assert counter.take() == {
            "topk": [100_000, 25_000, 50_000],
            "topk_row": [25_000] * 3 + [50_000],
            "hinted": [],
            "hinted_row": [],
            "above": [100_000, 100_000],
        }
        assert counter.take() == {
            "topk": [],
            "topk_row": [],
            "hinted": [],
            "hinted_row": [],
            "above": [],
        }
        for call in range(2):  # under a key: from the second call on every row starts from a hint
            selector.topk_rows(SyntheticGradients(100_000, call).get(0, 0).view(4, -1), 10, key="m")
        assert counter.take() == {
            "topk": [25_000],
            "topk_row": [25_000] * 3,
            "hinted": [25_000],
            "hinted_row": [25_000] * 3,
            "above": [],
        }
    selector.topk(x, 100)  # the counter is gone: nothing is logged, nothing changed in Selector
    assert counter.take() == {kind: [] for kind in SelectionCounter.KINDS}


@pytest.mark.parametrize(
    "name,kinds",
    [
        ("spardl", ["topk", "hinted"]),
        ("topk", ["topk", "hinted"]),
        ("topkdsa", ["topk", "hinted"]),
        ("gtopk", ["topk", "hinted"]),
        ("oktopk", ["topk", "above"]),
        ("gaussiank", ["above", "above"]),
    ],
)
def test_every_method_s_selections_are_counted(name, kinds):
    """Each method's own selection pass shows up in the counts the model prices (a method
    whose selector entry point the counter missed would be predicted to select for free); the
    methods that name their rows start the second call from remembered thresholds."""
    records = simulator.record_calls(name, {}, workers=2, numel=20_000, density=0.01, calls=2)
    for kind, call in zip(kinds, records[0]):
        assert sum(call["selections"][kind]) >= 20_000 / 2, (name, kind, call["selections"])


def test_shared_sum_group_sums_in_rank_order():
    values = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(12)]
    expected = values[0].clone()
    for value in values[1:]:
        expected += value
    results = simulator.SharedSumGroup(12).run(
        lambda t: [t.allreduce_sum(values[t.rank]) for _ in range(3)]
    )
    assert all(torch.equal(r, expected) for calls in results for r in calls)


def test_selection_cost_interpolates_a_measured_curve():
    cost = SelectionCost(0.01, threads=1, repeats=1)
    for kind in SelectionCounter.KINDS:
        assert all(t > 0 for t in cost.seconds_at[kind])
        assert cost.seconds(kind, [4**8, 4**8]) == pytest.approx(2 * cost.seconds(kind, [4**8]))
        assert cost.rate(kind, 10**9) == pytest.approx(cost.rate(kind, 4**12))  # constant beyond


def test_p64_runs_quickly_and_spardl_sends_least(tmp_path):
    start = time.perf_counter()
    rows, sweep = simulate.main(
        [
            "--workers",
            "64",
            "--numel",
            "16384",
            "--methods",
            "spardl,topk,dense",
            "--select-rate",
            "1e9",
            "--sweep",
            "4",
            "--json",
            str(tmp_path / "sim.json"),
            "--plot",
            str(tmp_path / "sim.png"),
        ]
    )
    assert time.perf_counter() - start < 60
    assert len(rows) == 3 * 2 and len(sweep) == 3 * 2  # 3 methods, d = 1, 2, 4; two networks
    net = {(r["network"], r["label"]): r["network_ms"] for r in rows}
    for network in ("ethernet", "infiniband"):
        assert net[(network, "spardl")] < net[(network, "topk")] < net[(network, "dense")]
    assert (
        json.loads((tmp_path / "sim.json").read_text())[0]["model_numel"] == simulator.VGG16_NUMEL
    )
    assert (tmp_path / "sim.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--network", "ib"],
            "--network ib: unknown network; valid: ethernet, infiniband, shared:RATE",
        ),
        (["--network", "shared:fast"], "'fast' is not a rate"),
        (["--network", "shared:-1gbit"], "'-1gbit' is not a rate"),
        (["--message-cost", "-1"], "--message-cost must be a finite number of seconds >= 0"),
        (["--host-cores", "0"], "--host-cores must be >= 1, got 0"),
        (
            ["--select-rate", "fast"],
            "--select-rate must be a positive number of entries/s or 'measured'",
        ),
        (["--compare", "/no/such.json"], "--compare /no/such.json: [Errno 2]"),
        (["--srs", "x"], "--srs takes a comma-separated list of rounds, blocks"),
        (["--methods", "foo"], "unknown synchronization method 'foo'"),
        (["--workers", "4,x"], "--workers takes comma-separated integers"),
        (["--workers", "0"], "--workers takes integers >= 1"),
        (["--teams", "0"], "--teams takes integers >= 1"),
        (["--sweep", "8,y"], "--sweep takes comma-separated integers"),
        (["--density", "2"], "density must lie in"),
        (["--alpha", "1e-6"], "--alpha and --beta go together"),
        (["--select-device", "gpu"], "invalid choice: 'gpu'"),
        (["--select-rate", "0"], "--select-rate must be a positive number"),
        (["--select-rate", "nan"], "--select-rate must be a positive number"),
        (["--alpha", "-1", "--beta", "1e-9"], "--alpha and --beta must be finite, >= 0"),
        (["--alpha", "0", "--beta", "0"], "not both 0"),
        (["--select-threads", "0"], "--select-threads must be >= 1"),
        (["--json", "/no/such/dir/sim.json"], "--json /no/such/dir/sim.json: no directory"),
        (["--plot", "sim.xyz"], "--plot sim.xyz: the name must end in an image format"),
        (["--seed", "-2"], "--seed must be >= 0, got -2"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.parse_args(argv)
    assert exit_.value.code == 2
    assert re.search(re.escape(message), capsys.readouterr().err)


def test_team_counts_that_fit_no_p_are_reported_and_nothing_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.main(
            [
                "--numel",
                "4096",
                "--select-rate",
                "1e9",
                "--workers",
                "4",
                "--methods",
                "spardl",
                "--teams",
                "3",
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--teams 3 skipped: a team count must divide P = 4" in err and "nothing to simulate" in err
    )


def test_a_team_sweep_alone_runs_and_plots(tmp_path, capsys):
    rows, sweep = simulate.main(
        [
            "--numel",
            "4096",
            "--select-rate",
            "1e9",
            "--workers",
            "4",
            "--methods",
            "spardl",
            "--teams",
            "3",
            "--sweep",
            "4",
            "--network",
            "ethernet",
            "--plot",
            str(tmp_path / "sweep.svg"),
        ]
    )
    assert rows == [] and [r["teams"] for r in sweep] == [1, 2, 4]
    assert "spardl against the team count d" in capsys.readouterr().out
    assert (tmp_path / "sweep.svg").read_text().startswith("<?xml")


def test_every_row_runs_once_per_wire_with_the_bytes_of_that_wire(tmp_path, capsys):
    rows, sweep = simulate.main(
        [
            "--numel",
            "65536",
            "--workers",
            "4",
            "--methods",
            "topk,gtopk,oktopk,spardl,dense",
            "--wire",
            "fp32,fp16,bf16",
            "--sweep",
            "4",
            "--network",
            "shared:1gbit",
            "--json",
            str(tmp_path / "sim.json"),
        ]
    )
    assert [r["label"] for r in rows[:3]] == ["topk", "topk(wire=fp16)", "topk(wire=bf16)"]
    assert [r["wire"] for r in rows] == ["fp32", "fp16", "bf16"] * 5
    by_label = {r["label"]: r for r in rows}
    for method in ("topk", "gtopk", "oktopk", "spardl", "dense"):
        fp32 = by_label[method]
        for wire in ("fp16", "bf16"):
            row = by_label[f"{method}(wire={wire})"]
            ratio = row["model_bytes_per_rank"] / fp32["model_bytes_per_rank"]
            assert 0.45 < ratio < 0.56, (method, wire, ratio)
            assert row["network_ms"] < 0.6 * fp32["network_ms"], (method, wire)
    assert [(r["teams"], r["wire"]) for r in sweep][:2] == [(1, "fp32"), (1, "fp16")]
    out = capsys.readouterr().out
    assert "spardl(wire=fp16) vs topk(wire=fp16)" in out and "spardl vs topk(wire" not in out
    assert {r["wire"] for r in json.loads((tmp_path / "sim.json").read_text())} == {
        "fp32",
        "fp16",
        "bf16",
    }
    with pytest.raises(SystemExit) as exit_:
        simulate.parse_args(["--wire", "fp8"])
    assert exit_.value.code == 2
    assert "--wire takes a comma-separated list of fp32, fp16, bf16" in capsys.readouterr().err


def test_compare_predicts_a_bench_row_at_its_wire(tmp_path):
    def row(label, wire, options):
        return {
            "method": "topk",
            "label": label,
            "workers": 2,
            "numel": 30_000_000,
            "density": 0.01,
            "median_ms": 4.0,
            "network": "1gbit",
            "wire": wire,
            "options": options,
        }

    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps([row("topk", "fp32", {}), row("topk(wire=fp16)", "fp16", {"wire": "fp16"})])
    )
    rows, _ = simulate.main(["--compare", str(path), "--numel", "4096"])
    assert [r["wire"] for r in rows] == ["fp32", "fp16"]
    assert rows[1]["predicted_network_ms"] < 0.6 * rows[0]["predicted_network_ms"]


@pytest.mark.parametrize(
    "numel,workers,density",
    [(1 << 18, 256, 0.01), (8192, 64, 0.01), (4099, 3, 0.03), (1000, 7, 1.0), (50_000, 48, 0.001)],
)
def test_simulated_n_gives_every_block_its_share_of_the_density(numel, workers, density):
    simulated = simulator.simulated_numel(numel, workers, density)
    assert numel <= simulated < numel + workers * (1 / density + 1)
    for teams in (d for d in range(1, workers + 1) if workers % d == 0):
        block = simulated // (workers // teams)
        assert simulated % (workers // teams) == 0
        assert (
            int(block * density) > block * density * (1 - 1 / block) - 1e-9
        )  # nothing lost to rounding


def test_spardl_traffic_scales_to_that_of_the_model_size():
    """At n = 8192 and P = 64 an unrounded block would keep 1 of 1.28 entries (21% too little)."""
    workers, model = 64, simulator.VGG16_NUMEL
    rows, _ = simulate.main(
        [
            "--workers",
            str(workers),
            "--numel",
            "8192",
            "--methods",
            "spardl",
            "--select-rate",
            "1e9",
            "--network",
            "ethernet",
        ]
    )
    block_budget = int(-(-model // workers) * 0.01)
    expected = (
        2 * (workers - 1) * block_budget * 8
    )  # SRS and Bruck each send P-1 lists of k_b (index, value)
    assert rows[0]["model_bytes_per_rank"] == pytest.approx(expected, rel=0.01)


def test_the_testbed_model_by_hand():
    """One link of 1 Gbit/s (125e6 bytes/s) shared by 3 ranks, 50 us per message, scale 2.

    round 0: rank 0 sends 2 messages (1000 + 500 bytes), rank 1 one (2500), rank 2 one (1000):
        the busiest rank's messages, 2 * 50 us = 100 us, plus all ranks' bytes through the one
        link, 2 * (1500 + 2500 + 1000) / 125e6 s = 80 us: 180 us
    rounds 1 and 2: a dense all-reduce of 3000 bytes per rank counted as 2 rounds: one message
        and 1500 bytes per rank and round: 50 us + 2 * 3 * 1500 / 125e6 s = 50 + 72 = 122 us each
    round 3 is past the counted rounds: ignored. Network: 180 + 2 * 122 = 424 us.
    Selection at 1e6 entries/s: rank 2 scans most, 2 * (4000 + 1000) entries: 10 ms.
    """
    link = parse_network("shared:1gbit", 50e-6)
    assert link == SharedLink("shared:1gbit", 50e-6, 125e6)
    int32 = torch.int32
    allreduce = Event("allreduce", 1, None, 3000, torch.float32, rounds=2)
    records = [
        {
            "rounds": 3,
            "selections": {"topk": [1000], "above": []},
            "events": [
                Event("send", 0, 1, 1000, int32),
                Event("send", 0, 2, 500, int32),
                allreduce,
                Event("send", 3, 1, 10**6, int32),
            ],
        },
        {
            "rounds": 3,
            "selections": {"topk": [], "above": [3000]},
            "events": [
                Event("send", 0, 0, 2500, int32),
                Event("recv", 0, 0, 1000, int32),
                allreduce,
            ],
        },
        {
            "rounds": 3,
            "selections": {"topk": [4000], "hinted": [1000]},
            "events": [Event("send", 0, 0, 1000, int32), allreduce],
        },
    ]
    predicted = simulator.predict_call(records, link, 2.0, SelectionCost(0.01, rate=1e6))
    assert predicted["network"] == pytest.approx(424e-6, rel=1e-12)
    assert predicted["select"] == pytest.approx(10e-3, rel=1e-12)
    assert predicted["total"] == pytest.approx(424e-6 + 10e-3, rel=1e-12)
    # the 3 ranks on 2 cores: each computes 3 / 2 times as long, 15 ms of selection; on 4 cores
    # 10 ms
    for cores, select in ((2, 15e-3), (4, 10e-3)):
        shared_cores = parse_network("shared:1gbit", 50e-6, cores)
        predicted = simulator.predict_call(
            records, shared_cores, 2.0, SelectionCost(0.01, rate=1e6)
        )
        assert (predicted["network"], predicted["select"]) == pytest.approx(
            (424e-6, select), rel=1e-12
        )
    # the same traffic on per-rank links of that rate: the busiest rank, not the sum of all
    own_links = Network("own", 50e-6, 1 / 125e6)
    # round 0: max(2 * 50 + 2 * 1500 / 125, 50 + 2 * 2500 / 125, 50 + 2 * 1000 / 125) us = 124 us;
    # rounds 1, 2: 50 + 2 * 1500 / 125 us = 74 us
    assert simulator.predict_call(records, own_links, 2.0, SelectionCost(0.01, rate=1e6))[
        "network"
    ] == pytest.approx((124 + 2 * 74) * 1e-6, rel=1e-12)


@pytest.mark.parametrize(
    "text,rate",
    [
        ("1gbit", 125e6),
        ("10gbit", 1.25e9),
        ("100mbit", 12.5e6),
        ("125mbps", 125e6),
        ("8000", 1000.0),
        ("1.5kbit", 187.5),
        ("2e9bit", 2.5e8),
    ],
)
def test_rates_are_read_as_tc_writes_them(text, rate):
    assert parse_rate(text) == pytest.approx(rate)


def test_compare_predicts_each_bench_row_on_the_network_it_ran_on(tmp_path, capsys):
    def row(method, label, workers, median, network="1gbit", **extra):
        return {
            "method": method,
            "label": label,
            "workers": workers,
            "numel": 30_000,
            "density": 0.01,
            "median_ms": median,
            "network": network,
            "teams": 1,
            **extra,
        }

    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(
            [
                row("topk", "topk", 2, 4.0),
                row("spardl", "spardl(blocks)", 2, 2.0, srs="blocks", sag="bruck"),
                row("floor", "floor", 2, 1.0),
            ]
        )
    )
    rows, _ = simulate.main(
        ["--compare", str(path), "--numel", "4096", "--json", str(tmp_path / "c.json")]
    )
    assert [(r["label"], r["network"]) for r in rows] == [
        ("topk", "shared:1gbit"),
        ("spardl(blocks)", "shared:1gbit"),
    ]
    alone, _ = simulate.main(
        [
            "--workers",
            "2",
            "--numel",
            "4096",
            "--model-numel",
            "30000",
            "--methods",
            "topk",
            "--network",
            "shared:1gbit",
        ]
    )
    assert rows[0]["predicted_ms"] == alone[0]["predicted_ms"]
    assert rows[0]["error_pct"] == pytest.approx(100 * (rows[0]["predicted_ms"] - 4.0) / 4.0)
    out = capsys.readouterr().out
    assert (
        "selection: a fixed 1000 M entries/s (the default)" in out
        and "mean |error| per method" in out
    )
    assert json.loads((tmp_path / "c.json").read_text())[1]["table"] == "compare"
    path.write_text(json.dumps([row("topk", "topk", 2, 4.0, network="loopback")]))
    with pytest.raises(SystemExit) as exit_:
        simulate.main(["--compare", str(path), "--numel", "4096"])
    assert exit_.value.code == 2 and "ran on loopback, which has no rate" in capsys.readouterr().err
    rows, _ = simulate.main(
        ["--compare", str(path), "--numel", "4096", "--network", "shared:10gbit,ethernet"]
    )
    assert [r["network"] for r in rows] == ["shared:10gbit", "ethernet"]


@pytest.mark.mpi
def test_the_per_message_cost_is_measured_under_mpiexec():
    result = mpiexec(2, "-m", "syncbench.latency", "--rounds", "20", "--warmup", "2", timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(
        r"per-message cost on \S+ at P = 2: median [0-9.]+ us per round \(quartiles .*\); "
        r"use it as simulate.py --message-cost \S+\n",
        result.stdout,
    )
