"""The scale simulator: counts equal mpiexec's, the network model by hand, P = 64 runs quickly."""
import json
import os
import re
import sys
import time

import pytest
import torch

import compressors
from comm.recording import Event
from mpirun import ROOT, mpiexec

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_allreduce as bench  # noqa: E402
import simulate  # noqa: E402

COUNT_KEYS = ("bytes_per_rank", "bytes_max_rank", "messages", "rounds", "nnz")


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [3, 4])
def test_counts_equal_those_under_mpiexec(workers, tmp_path):
    numel, density, warmup, iters, seed = 4099, 0.03, 1, 2, 5
    path = tmp_path / "rows.json"
    result = mpiexec(workers, os.path.join("scripts", "bench_allreduce.py"), "--numel", str(numel),
                     "--density", str(density), "--warmup", str(warmup), "--iters", str(iters),
                     "--seed", str(seed), "--teams", f"1,{workers}", "--json", str(path), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [row for row in json.loads(path.read_text()) if row["method"] not in (bench.FLOOR, bench.EF_FLOOR)]
    assert {row["method"] for row in rows} == set(compressors.available())
    for row in rows:
        per_rank = simulate.record_calls(row["method"], {"teams": row["teams"]} if row["method"] == "spardl" else {},
                                         workers, numel, density, warmup + iters, seed)
        counts = bench.summarize_counts([records[warmup:] for records in per_rank])
        assert counts == {key: row[key] for key in COUNT_KEYS}, row["label"]


def test_the_log_adds_up_to_the_traffic_counts():
    for method in compressors.available():
        for records in simulate.record_calls(method, {}, 5, 3000, 0.05, 2):
            for record in records:
                counted = [e for e in record["events"] if e.round < record["rounds"]]
                sends = [e for e in counted if e.kind != "recv"]
                assert sum(e.nbytes for e in sends) == record["bytes"], method
                assert sum(e.rounds for e in sends) == record["messages"], method


def test_network_model_by_hand():
    alpha, beta = 2.0, 0.5
    network = simulate.Network("toy", alpha, beta)
    int32 = torch.int32
    rank0 = {"rounds": 3, "selections": {"topk": [100], "above": []},
             "events": [Event("send", 0, 1, 8, int32), Event("send", 0, 1, 4, int32),
                        Event("allreduce", 1, None, 12, torch.float32, rounds=2),
                        Event("send", 3, 1, 1000, int32)]}  # round 3 is not counted: ignored
    rank1 = {"rounds": 3, "selections": {"topk": [], "above": [300]},
             "events": [Event("send", 0, 0, 20, int32), Event("recv", 0, 0, 12, int32),
                        Event("allreduce", 1, None, 12, torch.float32, rounds=2)]}
    cost = simulate.SelectionCost(0.01, threads=1, rate=100.0)
    predicted = simulate.predict_call([rank0, rank1], network, 2.0, cost)
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
    assert simulate.call_weights(alike, 1, 3) == [0.0, 0.5, 0.5]
    assert simulate.call_weights(alike, 0, 1) == [1.0]
    # Ok-Topk's defaults: calls 0 and 32 exact, 0 also re-splits; only calls 0 and 1 recorded
    def oktopk(step):
        return step % 32 == 0, step % 64 == 0, step % 32 == 0
    assert simulate.call_weights(_Periodic(64, oktopk), 1, 2) == pytest.approx([2 / 64, 62 / 64])
    every_third = _Periodic(3, lambda step: step % 3 == 0)
    assert simulate.call_weights(every_third, 1, 6) == pytest.approx([0, 1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6])
    assert simulate.call_weights(every_third, 0, 1) == [1.0]  # nothing else recorded: call 0 stands in


def test_oktopk_kinds_follow_its_intervals():
    records = simulate.record_calls("oktopk", {"local_interval": 2, "global_interval": 2, "region_interval": 4},
                                    workers=2, numel=20_000, density=0.01, calls=5, warmup=1)
    weights = [record["weight"] for record in records[0]]
    assert weights == pytest.approx([0, 1 / 4, 1 / 4, 1 / 4, 1 / 4])  # calls 2, 4 exact; 1, 3 reuse
    exact = [sum(record["selections"]["topk"] + record["selections"]["hinted"]) >= 20_000
             for record in records[0]]
    assert exact == [True, False, True, False, True]


def test_scanned_elements_are_weighted_like_the_prediction():
    """Ok-Topk's reported scan per rank counts its exact call at its share, as the time does."""
    rows, _ = simulate.main(["--workers", "2", "--numel", "20000", "--methods", "oktopk",
                             "--select-rate", "1e9", "--network", "ethernet"])
    per_rank = simulate.record_calls("oktopk", {}, 2, 20000, 0.01, 2, warmup=1)
    scans = [[sum(map(sum, record["selections"].values())) for record in records] for records in per_rank]
    expected = sum(2 / 64 * calls[0] + 62 / 64 * calls[1] for calls in scans) / 2
    assert scans[0][0] != scans[0][1]  # the exact call scans differently
    assert rows[0]["scanned_per_rank"] == pytest.approx(expected)


def test_the_prediction_is_the_weighted_mean_of_the_calls():
    network = simulate.Network("toy", 1.0, 0.0)
    cost = simulate.SelectionCost(0.01, threads=1, rate=1.0)

    def call(length, weight):
        return {"rounds": 1, "events": [], "selections": {"topk": [length], "above": []}, "weight": weight}

    predicted = simulate.predict([[call(10, 0.25), call(2, 0.75)]], network, 1.0, cost)
    assert predicted["select"] == pytest.approx(0.25 * 10 + 0.75 * 2)
    assert predicted["network"] == pytest.approx(1.0)


def test_crossovers_compare_each_spardl_run_with_the_other_methods():
    def row(label, workers, ms):
        return {"network": "toy", "label": label, "method": label.split("(")[0], "workers": workers,
                "predicted_ms": ms}

    rows = [row("spardl", 16, 5.0), row("spardl", 64, 3.0), row("spardl(d=4)", 16, 6.0),
            row("spardl(d=4)", 64, 1.0), row("oktopk", 16, 4.0), row("oktopk", 64, 2.0)]
    assert simulate.crossovers(rows) == ["toy: spardl vs oktopk: faster at P=none, slower at P=[16, 64]"]
    assert simulate.crossovers(rows, "spardl(d=4)") == [
        "toy: spardl(d=4) vs oktopk: faster at P=[64], slower at P=[16]; crossover between P 16->64"]


def test_selection_counter_logs_outer_calls_once():
    selector = compressors.Selector()
    x = bench.SyntheticGradients(100_000, 0).get(0, 0)
    with simulate.SelectionCounter() as counter:
        selector.topk(x, 100)  # calls topk_rows() internally
        selector.topk_rows(x.view(4, -1), 10)  # a matrix: its first row, then 3 further rows
        selector.above(x.abs(), 1.0)
        selector.cut(x.clone().view(2, -1), 10)  # through scan: a row and a further row
        selector.at_least(x, 1.0)
        assert counter.take() == {"topk": [100_000, 25_000, 50_000], "topk_row": [25_000] * 3 + [50_000],
                                  "hinted": [], "hinted_row": [], "above": [100_000, 100_000]}
        assert counter.take() == {"topk": [], "topk_row": [], "hinted": [], "hinted_row": [], "above": []}
        for call in range(2):  # under a key: from the second call on every row starts from a hint
            selector.topk_rows(bench.SyntheticGradients(100_000, call).get(0, 0).view(4, -1), 10, key="m")
        assert counter.take() == {"topk": [25_000], "topk_row": [25_000] * 3, "hinted": [25_000],
                                  "hinted_row": [25_000] * 3, "above": []}
    for method in simulate.SelectionCounter.METHODS:
        assert "wrapper" not in getattr(compressors.Selector, method).__name__


@pytest.mark.parametrize("name,kinds", [("spardl", ["topk", "hinted"]), ("topk", ["topk", "hinted"]),
                                        ("topkdsa", ["topk", "hinted"]), ("gtopk", ["topk", "hinted"]),
                                        ("oktopk", ["topk", "above"]), ("gaussiank", ["above", "above"])])
def test_every_method_s_selections_are_counted(name, kinds):
    """Each method's own selection pass shows up in the counts the model prices (a method
    whose selector entry point the counter missed would be predicted to select for free); the
    methods that name their rows start the second call from remembered thresholds."""
    records = simulate.record_calls(name, {}, workers=2, numel=20_000, density=0.01, calls=2)
    for kind, call in zip(kinds, records[0]):
        assert sum(call["selections"][kind]) >= 20_000 / 2, (name, kind, call["selections"])


def test_shared_sum_group_sums_in_rank_order():
    values = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(12)]
    expected = values[0].clone()
    for value in values[1:]:
        expected += value
    results = simulate.SharedSumGroup(12).run(lambda t: [t.allreduce_sum(values[t.rank]) for _ in range(3)])
    assert all(torch.equal(r, expected) for calls in results for r in calls)


def test_selection_cost_interpolates_a_measured_curve():
    cost = simulate.SelectionCost(0.01, threads=1, repeats=1)
    for kind in simulate.SelectionCounter.KINDS:
        assert all(t > 0 for t in cost.seconds_at[kind])
        assert cost.seconds(kind, [4 ** 8, 4 ** 8]) == pytest.approx(2 * cost.seconds(kind, [4 ** 8]))
        assert cost.rate(kind, 10 ** 9) == pytest.approx(cost.rate(kind, 4 ** 12))  # constant beyond


def test_p64_runs_quickly_and_spardl_sends_least(tmp_path):
    start = time.perf_counter()
    rows, sweep = simulate.main(["--workers", "64", "--numel", "16384", "--methods", "spardl,topk,dense",
                                 "--select-rate", "1e9", "--sweep", "4", "--json", str(tmp_path / "sim.json"),
                                 "--plot", str(tmp_path / "sim.png")])
    assert time.perf_counter() - start < 60
    assert len(rows) == 3 * 2 and len(sweep) == 3 * 2  # 3 methods, d = 1, 2, 4; two networks
    net = {(r["network"], r["label"]): r["network_ms"] for r in rows}
    for network in ("ethernet", "infiniband"):
        assert net[(network, "spardl")] < net[(network, "topk")] < net[(network, "dense")]
    assert json.loads((tmp_path / "sim.json").read_text())[0]["model_numel"] == simulate.VGG16_NUMEL
    assert (tmp_path / "sim.png").stat().st_size > 10_000


@pytest.mark.parametrize("argv,message", [
    (["--network", "ib"], "--network ib: unknown preset; valid: ethernet, infiniband"),
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
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.parse_args(argv)
    assert exit_.value.code == 2
    assert re.search(re.escape(message), capsys.readouterr().err)


def test_team_counts_that_fit_no_p_are_reported_and_nothing_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.main(["--numel", "4096", "--select-rate", "1e9", "--workers", "4", "--methods",
                       "spardl", "--teams", "3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--teams 3 skipped: a team count must divide P = 4" in err and "nothing to simulate" in err


def test_a_team_sweep_alone_runs_and_plots(tmp_path, capsys):
    rows, sweep = simulate.main(["--numel", "4096", "--select-rate", "1e9", "--workers", "4", "--methods",
                                 "spardl", "--teams", "3", "--sweep", "4", "--network", "ethernet",
                                 "--plot", str(tmp_path / "sweep.svg")])
    assert rows == [] and [r["teams"] for r in sweep] == [1, 2, 4]
    assert "spardl against the team count d" in capsys.readouterr().out
    assert (tmp_path / "sweep.svg").read_text().startswith("<?xml")


@pytest.mark.parametrize("numel,workers,density", [(1 << 18, 256, 0.01), (8192, 64, 0.01), (4099, 3, 0.03),
                                                   (1000, 7, 1.0), (50_000, 48, 0.001)])
def test_simulated_n_gives_every_block_its_share_of_the_density(numel, workers, density):
    simulated = simulate.simulated_numel(numel, workers, density)
    assert numel <= simulated < numel + workers * (1 / density + 1)
    for teams in (d for d in range(1, workers + 1) if workers % d == 0):
        block = simulated // (workers // teams)
        assert simulated % (workers // teams) == 0
        assert int(block * density) > block * density * (1 - 1 / block) - 1e-9  # nothing lost to rounding


def test_spardl_traffic_scales_to_that_of_the_model_size():
    """At n = 8192 and P = 64 an unrounded block would keep 1 of 1.28 entries (21% too little)."""
    workers, model = 64, simulate.VGG16_NUMEL
    rows, _ = simulate.main(["--workers", str(workers), "--numel", "8192", "--methods", "spardl",
                             "--select-rate", "1e9", "--network", "ethernet"])
    block_budget = int(-(-model // workers) * 0.01)
    expected = 2 * (workers - 1) * block_budget * 8  # SRS and Bruck each send P-1 lists of k_b (index, value)
    assert rows[0]["model_bytes_per_rank"] == pytest.approx(expected, rel=0.01)
