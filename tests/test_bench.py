"""The benchmark: contract keys under mpiexec, exactness at density 1, its helpers."""

import csv
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from entry_points import load_script
from mpirun import ROOT, mpiexec

import compressors
from allreducers.transports import local_group
from syncbench import plan
from syncbench.floor import FloorRun
from syncbench.gradients import SyntheticGradients
from syncbench.summary import summarize
from syncbench.timing import MethodRun, cosine

bench = load_script("bench_allreduce")

REQUIRED_KEYS = {
    "method",
    "workers",
    "numel",
    "density",
    "median_ms",
    "bytes_per_rank",
    "rounds",
    "nnz",
    "cosine",
}
SCRIPT = os.path.join("scripts", "bench_allreduce.py")


@pytest.fixture(scope="module")
def dense_density_rows(tmp_path_factory):
    """Every method (spardl also with 3 teams) at density 1 on 3 ranks, as JSON rows."""
    path = tmp_path_factory.mktemp("bench") / "rows.json"
    result = mpiexec(
        3,
        SCRIPT,
        "--numel",
        "3001",
        "--density",
        "1",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--teams",
        "1,3",
        "--json",
        str(path),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(path.read_text()), result.stdout


@pytest.mark.mpi
def test_json_rows_have_the_contract_keys(dense_density_rows):
    rows, stdout = dense_density_rows
    expected = [label for label, _, _ in plan.method_runs(compressors.available(), [1, 3], 3)]
    assert [row["label"] for row in rows] == expected + ["floor", "floor+ef"]
    for row in rows:
        assert REQUIRED_KEYS <= set(row), row
        assert row["workers"] == 3 and row["numel"] == 3001 and row["density"] == 1.0
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["rounds"] >= 1 and row["bytes_per_rank"] > 0
        assert row["label"] in stdout
        assert row["network"] == (os.environ.get("SPARDL_NETWORK_RATE") or "loopback")
        assert row["wire"] == "fp32" and "wire" not in row["options"]
        assert len(row["threads"]) == 3 and min(row["threads"]) >= 1
    assert f"network: {rows[0]['network']}" in stdout


@pytest.mark.mpi
def test_density_one_gives_the_exact_average(dense_density_rows):
    rows, _ = dense_density_rows
    for row in rows:
        if row["method"].startswith("floor"):
            assert row["cosine"] is None
            assert row["floor_ratio" if row["method"] == "floor" else "ef_floor_ratio"] == 1.0
        else:
            assert row["cosine"] == pytest.approx(1.0, abs=1e-6), row["label"]
            assert row["nnz"] == 3001, row["label"]


@pytest.mark.mpi
def test_interleaved_and_sequential_order_give_the_same_numbers(tmp_path, monkeypatch):
    """The order of the timed calls changes timings only: every method sees the same gradients
    and keeps its own state, so traffic, nnz and cosine agree row by row. The rows record the
    shaped network's rate and the emulated cluster's topology the environment names."""
    monkeypatch.setenv("SPARDL_NETWORK_RATE", "10gbit")
    cluster = {"hosts": 2, "ranks_per_host": 1, "rates": ["10gbit", "10gbit"], "delay": None}
    monkeypatch.setenv("SPARDL_CLUSTER", json.dumps(cluster))
    rows = {}
    for order in ("interleaved", "sequential"):
        path = tmp_path / f"{order}.json"
        flags = ["--sequential"] if order == "sequential" else []
        result = mpiexec(
            2,
            SCRIPT,
            "--numel",
            "5003",
            "--density",
            "0.02",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--methods",
            "spardl,topk,oktopk",
            "--json",
            str(path),
            *flags,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        rows[order] = json.loads(path.read_text())
    keys = ("label", "bytes_per_rank", "messages", "rounds", "nnz", "cosine")
    assert [[row[k] for k in keys] for row in rows["interleaved"]] == [
        [row[k] for k in keys] for row in rows["sequential"]
    ]
    assert {row["network"] for order in rows.values() for row in order} == {"10gbit"}
    assert all(row["topology"] == cluster for order in rows.values() for row in order)


@pytest.mark.mpi
def test_replay_counts_what_the_mpi_run_counts(dense_density_rows):
    """The same rows replayed as rank 0 alone: same traffic, rounds, nnz and exact cosine."""
    rows, _ = dense_density_rows
    replayed = bench.main(
        [
            "--replay",
            "3",
            "--numel",
            "3001",
            "--density",
            "1",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--teams",
            "1,3",
        ]
    )
    keys = ("label", "workers", "rounds", "nnz")
    assert [[row[k] for k in keys] for row in replayed] == [[row[k] for k in keys] for row in rows]
    for live, alone in zip(rows, replayed):  # ranks may differ in bytes: rank 0's is one of them
        assert alone["replay"] == 3 and live["replay"] is None
        assert alone["network"] == "none" and len(alone["threads"]) == 1
        assert 0 < alone["bytes_per_rank"] <= live["bytes_max_rank"], live["label"]
        if live["cosine"] is None:
            assert alone["cosine"] is None
        else:
            assert alone["cosine"] == pytest.approx(live["cosine"], abs=1e-6), live["label"]


def test_replay_times_rank_zero_alone_and_checks_its_result(monkeypatch):
    rows = bench.main(
        [
            "--replay",
            "4",
            "--numel",
            "4001",
            "--density",
            "0.02",
            "--iters",
            "3",
            "--methods",
            "spardl,oktopk,dense",
            "--sequential",
        ]
    )
    assert [row["label"] for row in rows] == ["spardl", "oktopk", "dense", "floor", "floor+ef"]
    assert all(row["workers"] == 4 and row["min_ms"] > 0 for row in rows)
    assert rows[0]["nnz"] == 4 * int(1001 * 0.02) and rows[-2]["floor_ratio"] == 1.0
    assert (
        rows[-1]["ef_floor_ratio"] == 1.0
        and rows[-1]["accumulate_ms"] > 0 == rows[-2]["accumulate_ms"]
    )
    monkeypatch.setattr(torch, "equal", lambda a, b: False)  # as if a replay went astray
    with pytest.raises(RuntimeError, match="replay of spardl differs from the recorded call"):
        bench.main(["--replay", "2", "--numel", "500", "--iters", "1", "--methods", "spardl"])


def test_team_counts_that_do_not_divide_p_are_reported(capsys):
    rows = bench.main(
        [
            "--replay",
            "3",
            "--numel",
            "600",
            "--iters",
            "1",
            "--methods",
            "spardl",
            "--teams",
            "1,2,3",
        ]
    )
    assert [row["label"] for row in rows] == ["spardl", "spardl(d=3)", "floor", "floor+ef"]
    assert "--teams 2 skipped: a team count must divide P = 3" in capsys.readouterr().err


def test_single_process_writes_csv_and_plot(tmp_path):
    csv_path, png_path = tmp_path / "rows.csv", tmp_path / "bench.png"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    result = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--numel",
            "2000",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--methods",
            "spardl,topkA,dense",
            "--csv",
            str(csv_path),
            "--plot",
            str(png_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    assert [row["label"] for row in rows] == ["spardl", "topk", "dense", "floor", "floor+ef"]
    assert png_path.stat().st_size > 10_000
    assert "x floor" in result.stdout and "x ef" in result.stdout


def test_floor_with_error_feedback_does_what_every_residual_method_does():
    """floor+ef's work: the top-k of residual + gradient goes / P into the zeroed result and out
    of the residual, which keeps all the rest; the plain floor only selects."""
    generator = torch.Generator().manual_seed(0)
    run = FloorRun(SimpleNamespace(size=4), [], 1000, 0.05, error_feedback=True)
    out = torch.full((1000,), 7.0)
    for _ in range(3):
        grad = torch.randn(1000, generator=generator)
        total = run.state() + grad
        run.local_work(grad, out)
        chosen = total.abs().topk(50).indices
        expected = torch.zeros(1000)
        expected[chosen] = total[chosen] / 4
        assert torch.equal(out, expected)
        assert torch.equal(run.residual + 4 * out, total)
    saved = run.state()
    run.local_work(grad, out)
    run.restore(saved)
    assert torch.equal(run.residual, saved)
    before = out.clone()
    plain = FloorRun(SimpleNamespace(size=4), [], 1000, 0.05)
    plain.local_work(grad, out)
    assert plain.state() is None and torch.equal(out, before)


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--methods", "spardl,nope"],
            "unknown synchronization method 'nope'; valid: dense.*spardl",
        ),
        (["--density", "1.5"], "density must lie in"),
        (["--teams", "1,x"], "--teams takes comma-separated integers"),
        (["--teams", "0"], "--teams takes integers >= 1"),
        (["--srs", "rounds,steps"], "--srs takes a comma-separated list of rounds, blocks"),
        (["--sag", "ring"], "--sag takes a comma-separated list of bruck, recursive"),
        (["--replay", "2", "--lost-mass"], "--lost-mass needs the ranks' exchange"),
        (["--replay", "0"], "--replay must be >= 1, got 0"),
        (["--numel", "-5"], "^bench_allreduce.py: error: --numel must be >= 1, got -5\n$"),
        (["--iters", "0"], "^bench_allreduce.py: error: --iters must be >= 1, got 0\n$"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (
            ["--method-option", "nope=1", "--methods", "topk,oktopk"],
            "--method-option nope=1: no method of --methods \\(topk, oktopk\\) takes 'nope'; "
            "valid keys: dense_warmup, density_warmup, global_interval, global_scale, in_flight, ",
        ),
        (
            ["--method-option", "in_flight=x"],
            "--method-option in_flight=x: oktopk's in_flight takes a whole number",
        ),
        (["--method-option", "in_flight"], "--method-option in_flight: expected KEY=VALUE"),
        (["--json", "/no/such/dir/rows.json"], "--json /no/such/dir/rows.json: no directory"),
        (["--csv", "."], "--csv .: is a directory"),
        (
            ["--plot", "bench.txt"],
            "--plot bench.txt: the name must end in an image format: .*[.]png",
        ),
        (["--plot", "bench"], "--plot bench: the name must end in an image format"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--gradient", "foo"], "--gradient must be 'synthetic' or 'model:NAME'"),
        (["--gradient", "model:nosuch"], "unknown model 'nosuch'"),
        (
            ["--gradient", "model:cnn", "--input-shape", "3,32"],
            "--input-shape takes three integers",
        ),
        (
            ["--gradient", "model:cnn", "--input-shape", "3,2,2"],
            "model 'cnn' does not take inputs of shape 3,2,2",
        ),
        (["--gradient", "model:cnn", "--batch", "0"], "--batch >= 1 and --classes >= 2"),
    ],
)
@pytest.mark.filterwarnings(
    "ignore:Initializing zero-element tensors"
)  # the 3,2,2 network's last layer
def test_bad_arguments_are_usage_errors_naming_the_valid_choices(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_method_aliases_resolve_to_registry_names_and_repeats_are_dropped():
    args = bench.parse_args(["--methods", "topkA,spardl,topk", "--teams", "2,1,2"])
    assert (args.methods, args.teams) == (["topk", "spardl"], [2, 1])


def test_replay_under_mpiexec_and_usage_messages_of_other_ranks(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--replay", "2"])
    assert exit_.value.code == 2 and capsys.readouterr().err == ""  # rank 1 exits without a copy
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(SystemExit):
        bench.parse_args(["--replay", "2"])
    assert "--replay times one process alone: start it without mpiexec" in capsys.readouterr().err


def test_no_method_left_to_time_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(
            [
                "--replay",
                "2",
                "--numel",
                "600",
                "--iters",
                "1",
                "--methods",
                "spardl",
                "--teams",
                "3",
            ]
        )
    assert exit_.value.code == 2
    assert "nothing to time at P = 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "result,exact,expected",
    [
        ([1.0, 2.0], [2.0, 4.0], 1.0),
        ([1.0, 0.0], [0.0, 1.0], 0.0),
        ([0.0, 0.0], [0.0, 0.0], 1.0),
        ([0.0, 0.0], [1.0, 2.0], 0.0),
        ([float("nan"), 1.0], [1.0, 1.0], float("nan")),
        ([float("inf"), 1.0], [1.0, 1.0], float("nan")),
    ],
)
def test_cosine_shows_a_zero_or_non_finite_result(result, exact, expected):
    value = cosine(torch.tensor(result), torch.tensor(exact))
    assert value == pytest.approx(expected, nan_ok=True)


def test_synthetic_gradients_are_seeded_and_heavy_tailed():
    source = SyntheticGradients(50_000, seed=3)
    first = source.get(1, 2)
    assert torch.equal(first, SyntheticGradients(50_000, seed=3).get(1, 2))
    assert not torch.equal(first, source.get(0, 2)) and not torch.equal(first, source.get(1, 3))
    kurtosis = float(((first - first.mean()) ** 4).mean() / first.var() ** 2)
    assert kurtosis > 6  # a Gaussian has 3


def test_method_runs_keep_team_counts_that_divide_the_workers():
    runs = plan.method_runs(["dense", "spardl"], [1, 2, 3], workers=4)
    assert runs == [
        ("dense", "dense", {}),
        ("spardl", "spardl", {"teams": 1, "srs": "rounds", "sag": "bruck"}),
        ("spardl(d=2)", "spardl", {"teams": 2, "srs": "rounds", "sag": "bruck"}),
    ]


def test_spardl_variants_are_labelled_and_those_that_do_not_apply_skipped():
    runs = plan.method_runs(
        ["spardl"], [1, 2, 3, 4], workers=6, srs=("rounds", "blocks"), sag=("bruck", "recursive")
    )
    assert [label for label, _, _ in runs] == [
        "spardl",
        "spardl(blocks)",
        "spardl(d=2)",
        "spardl(d=2,blocks)",
        "spardl(d=2,recursive)",
        "spardl(d=2,blocks,recursive)",
        "spardl(d=3)",
        "spardl(d=3,blocks)",
    ]
    assert runs[5][2] == {"teams": 2, "srs": "blocks", "sag": "recursive"}
    assert plan.skipped(["spardl"], [1, 2, 3, 4], 6, ("bruck", "recursive")) == [
        "--sag recursive skipped at d=1: one team has no Spar-All-Gather (the bruck row)",
        # the registry's reason (compressors.check_options)
        "--sag recursive skipped at d=3: sag='recursive' needs teams a power of two, got 3; "
        "use sag='bruck' or teams in 1, 2",
        "--teams 4 skipped: a team count must divide P = 6",
    ]
    assert (
        plan.skipped(["topk"], [4], 6) == []
        and plan.method_runs(["spardl"], [1], 4, sag=("recursive",)) == []
    )


def test_replayed_variants_run_and_synchronize_alike_at_density_one():
    rows = bench.main(
        [
            "--replay",
            "4",
            "--numel",
            "2003",
            "--density",
            "1",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--methods",
            "spardl",
            "--teams",
            "1,4",
            "--srs",
            "rounds,blocks",
            "--sag",
            "recursive",
        ]
    )
    assert [row["label"] for row in rows] == [
        "spardl(d=4,recursive)",
        "spardl(d=4,blocks,recursive)",
        "floor",
        "floor+ef",
    ]
    assert [(row["srs"], row["sag"], row["teams"]) for row in rows[:2]] == [
        ("rounds", "recursive", 4),
        ("blocks", "recursive", 4),
    ]
    assert all(row["cosine"] == pytest.approx(1.0, abs=1e-6) for row in rows[:2])


def test_lost_mass_is_measured_outside_the_timed_call():
    """gtopk measures its lost mass only when asked, after the clock stopped; other methods
    ignore the request."""
    grads = [SyntheticGradients(3000, 0).get(rank, 0) for rank in range(4)]
    exact = torch.stack(grads).mean(0)

    def body(transport):
        records = []
        for name in ("gtopk", "topk"):
            for lost_mass in (False, True):
                run = MethodRun(transport, name, {}, 3000, 0.05, lost_mass)
                records.append(
                    (name, lost_mass, run.time(grads[transport.rank], exact, torch.empty(3000)))
                )
        return records

    for name, lost_mass, record in local_group(4).run(body)[0]:
        assert ("lost_mass" in record) == (lost_mass and name == "gtopk"), (name, lost_mass)
        if "lost_mass" in record:
            assert (
                record["lost_mass"] >= 0 and record["rounds"] == 2 * 2
            )  # the measurement is not counted


def test_summarize_takes_the_slowest_rank_of_each_call_and_its_split():
    def record(seconds, nbytes, select):  # the rest of the time is communication
        return {
            "seconds": seconds,
            "select": select,
            "comm": seconds - select,
            "accumulate": 0.0,
            "bytes": nbytes,
            "messages": 2,
            "rounds": 2,
            "host_syncs": 0,
            "nnz": 7,
            "cosine": 0.5,
        }

    # A rank that selects longest may wait least: the split is the slowest rank's, not each
    # phase's maximum over the ranks (that would be 0.030 + 0.035 for the second call).
    per_rank = [
        [record(0.010, 100, 0.009), record(0.030, 100, 0.005), record(0.020, 100, 0.010)],
        [record(0.040, 300, 0.010), record(0.029, 100, 0.029), record(0.020, 200, 0.020)],
    ]
    args = bench.parse_args(["--density", "0.5", "--methods", "dense"])
    row = summarize("x", "x", {}, per_rank, args, workers=2, numel=10)
    assert row["median_ms"] == pytest.approx(30.0) and row["max_ms"] == pytest.approx(40.0)
    assert row["select_ms"] == pytest.approx(10.0) and row["comm_ms"] == pytest.approx(25.0)
    assert row["bytes_per_rank"] == pytest.approx((200 + 100 + 150) / 3)
    assert row["bytes_max_rank"] == pytest.approx((300 + 100 + 200) / 3)
    assert (row["rounds"], row["nnz"], row["cosine"]) == (2, 7, 0.5)


@pytest.mark.mpi
def test_dense_overhead_prints_dense_beside_the_bare_all_reduces():
    result = mpiexec(
        3,
        "scripts/dense_overhead.py",
        "--numel",
        "10001",
        "--repeats",
        "3",
        "--warmup",
        "1",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(
        r"P = 3, n = 10001: bare Allreduce out of place [0-9.]+ ms, dense [0-9.]+ ms "
        r"\([0-9.]+x\); bare Allreduce in place [0-9.]+ ms, dense in place [0-9.]+ ms "
        r"\([0-9.]+x\)\n",
        result.stdout,
    ), result.stdout


def test_a_method_option_applies_to_the_methods_that_take_it():
    rows = bench.main(
        [
            "--replay",
            "2",
            "--numel",
            "600",
            "--iters",
            "1",
            "--methods",
            "oktopk,topk,spardl",
            "--method-option",
            "in_flight=2",
            "--method-option",
            "dense_warmup=1",
            "--method-option",
            "teams=2",  # wins over --teams
            "--teams",
            "1",
        ]
    )
    options = {row["label"]: row["options"] for row in rows}
    assert options == {
        "oktopk(in_flight=2,dense_warmup=1)": {"in_flight": 2, "dense_warmup": 1},
        "topk(dense_warmup=1)": {"dense_warmup": 1},
        "spardl(d=2,dense_warmup=1)": {
            "teams": 2,
            "srs": "rounds",
            "sag": "bruck",
            "dense_warmup": 1,
        },
        "floor": {},
        "floor+ef": {},
    }
    assert rows[2]["teams"] == 2


def test_a_method_option_value_that_fails_at_p_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(
            [
                "--replay",
                "2",
                "--numel",
                "600",
                "--methods",
                "oktopk",
                "--method-option",
                "in_flight=0",
            ]
        )
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "bench_allreduce.py: error: --method-option: oktopk(in_flight=0) at P = 2: "
        "in_flight must be an integer >= 1, got 0"
    ]


def test_every_row_runs_once_per_wire_labelled_with_it():
    runs = plan.method_runs(["topk", "spardl"], [1, 2], 4, wires=("fp32", "fp16"))
    assert runs == [
        ("topk", "topk", {}),
        ("topk(wire=fp16)", "topk", {"wire": "fp16"}),
        ("spardl", "spardl", {"teams": 1, "srs": "rounds", "sag": "bruck"}),
        (
            "spardl(wire=fp16)",
            "spardl",
            {"teams": 1, "srs": "rounds", "sag": "bruck", "wire": "fp16"},
        ),
        ("spardl(d=2)", "spardl", {"teams": 2, "srs": "rounds", "sag": "bruck"}),
        (
            "spardl(d=2,wire=fp16)",
            "spardl",
            {"teams": 2, "srs": "rounds", "sag": "bruck", "wire": "fp16"},
        ),
    ]
    assert [plan.row_wire(options) for _, _, options in runs] == ["fp32", "fp16"] * 3


def test_a_method_without_the_wire_option_gets_its_fp32_row_only(monkeypatch):
    options = compressors.options
    monkeypatch.setattr(
        compressors,
        "options",
        lambda name: [k for k in options(name) if name != "topk" or k != "wire"],
    )
    assert plan.method_runs(["topk", "dense"], [1], 4, wires=("fp16", "bf16")) == [
        ("topk", "topk", {}),
        ("dense(wire=fp16)", "dense", {"wire": "fp16"}),
        ("dense(wire=bf16)", "dense", {"wire": "bf16"}),
    ]


def test_a_16_bit_wire_row_sends_about_half_the_bytes(capsys):
    rows = bench.main(
        [
            "--replay",
            "4",
            "--numel",
            "200000",
            "--iters",
            "1",
            "--warmup",
            "1",
            "--methods",
            "dense,topk,gtopk,oktopk,spardl",
            "--wire",
            "fp16,fp32,bf16,fp16",  # repeats dropped, order kept
        ]
    )
    by_label = {row["label"]: row for row in rows}
    assert [row["wire"] for row in rows] == ["fp16", "fp32", "bf16"] * 5 + ["fp32", "fp32"]
    assert rows[-2]["label"] == "floor" and "spardl(wire=bf16)" in capsys.readouterr().out
    for method in ("dense", "topk", "gtopk", "oktopk", "spardl"):
        fp32 = by_label[method]["bytes_per_rank"]
        for wire in ("fp16", "bf16"):
            row = by_label[f"{method}(wire={wire})"]
            assert row["options"]["wire"] == wire and row["method"] == method
            assert 0.45 * fp32 < row["bytes_per_rank"] < 0.55 * fp32, (method, wire)


def test_the_wire_method_option_wins_over_the_flag_and_a_bad_wire_is_one_line(capsys):
    args = bench.parse_args(["--wire", "fp16,bf16", "--method-option", "wire=bf16"])
    assert args.wire == ("bf16",) and all("wire" not in chosen for chosen in args.options.values())
    assert bench.parse_args([]).wire == ("fp32",)
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--wire", "fp32,fp8"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "bench_allreduce.py: error: --wire takes a comma-separated list of fp32, fp16, bf16; "
        "got 'fp32,fp8'"
    ]


@pytest.mark.mpi
def test_json_rows_record_their_wire(tmp_path):
    path = tmp_path / "rows.json"
    result = mpiexec(
        2,
        SCRIPT,
        "--numel",
        "70000",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--methods",
        "topk,spardl",
        "--wire",
        "fp32,fp16",
        "--json",
        str(path),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["label"]: row for row in json.loads(path.read_text())}
    assert {label: row["wire"] for label, row in rows.items()} == {
        "topk": "fp32",
        "topk(wire=fp16)": "fp16",
        "spardl": "fp32",
        "spardl(wire=fp16)": "fp16",
        "floor": "fp32",
        "floor+ef": "fp32",
    }
    for method in ("topk", "spardl"):
        ratio = rows[f"{method}(wire=fp16)"]["bytes_per_rank"] / rows[method]["bytes_per_rank"]
        assert 0.45 < ratio < 0.6, (method, ratio)


@pytest.mark.mpi
def test_json_rows_record_the_method_options(tmp_path):
    path = tmp_path / "rows.json"
    result = mpiexec(
        2,
        SCRIPT,
        "--numel",
        "3001",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--methods",
        "oktopk,dense",
        "--method-option",
        "in_flight=1",
        "--json",
        str(path),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["label"]: row for row in json.loads(path.read_text())}
    assert rows["oktopk(in_flight=1)"]["options"] == {"in_flight": 1}
    assert rows["dense"]["options"] == {}


@pytest.mark.mpi
def test_a_gradient_too_long_for_int32_indices_is_refused_before_allocating():
    """It used to allocate until the kernel killed a rank: status 9 and MPICH's crash banner."""
    result = mpiexec(2, SCRIPT, "--numel", "3000000000", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    limited = [name for name in compressors.available() if name != "dense"]  # the int32 ones
    assert (result.stdout + result.stderr).splitlines() == [
        "bench_allreduce.py: error: --numel 3000000000 is above 2,147,483,647, the most entries "
        f"{', '.join(limited)} address (int32 indices); use a smaller --numel or --methods dense"
    ]


def test_a_gradient_too_large_for_the_memory_is_refused_before_allocating(monkeypatch, capsys):
    from syncbench import cli

    monkeypatch.setattr(cli, "available_memory", lambda: 10**9)
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--numel", "100000000", "--methods", "dense"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "bench_allreduce.py: error: --numel 100000000 needs at least 2.0 GB of memory on this "
        "host (5 float32 buffers of n entries over its ranks), more than the 1.0 GB available; "
        "use a smaller --numel, --sequential or fewer --methods"
    ]
    assert bench.parse_args(["--numel", "10000000", "--methods", "dense"]).numel == 10**7


@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_model_gradients_need_no_pythonpath(tmp_path, where):
    """The trainer's models package is not installed; the bench finds it all the same."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, SCRIPT),
            "--gradient",
            "model:cnn",
            "--input-shape",
            "1,8,8",
            "--replay",
            "2",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--methods",
            "dense",
        ],
        cwd=ROOT if where == "repository" else tmp_path,
        env=dict(env, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dense" in result.stdout


def test_teams_auto_and_layouts_are_rows_of_their_own():
    runs = plan.method_runs(["spardl"], [1, 2, "auto"], 4, layouts=("block", "strided"))
    assert [label for label, _, _ in runs] == [
        "spardl",
        "spardl(d=2)",
        "spardl(d=2,strided)",
        "spardl(d=auto)",
    ]
    assert runs[-1][2] == {"teams": "auto", "srs": "rounds"}
    assert plan.skipped(["spardl"], [1, "auto"], 4, layouts=("strided",)) == [
        "--layout strided skipped at d=1: with d = 1 or d = P its teams are the block "
        "layout's (that row)"
    ]
    args = bench.parse_args(["--teams", "1,auto,2", "--layout", "strided,block"])
    assert args.teams == [1, "auto", 2] and args.layout == ("strided", "block")
    with pytest.raises(SystemExit):
        bench.parse_args(["--layout", "ring"])


def test_a_teams_auto_row_records_its_choice(capsys):
    rows = bench.main(
        ["--replay", "4", "--numel", "2001", "--iters", "1", "--warmup", "0"]
        + ["--methods", "spardl", "--teams", "1,auto"]
    )
    fixed, auto = rows[0], rows[1]
    assert auto["label"] == "spardl(d=auto)" and auto["teams_requested"] == "auto"
    assert fixed["teams_requested"] == 1 and fixed["layout"] == "block"
    assert auto["teams"] in (1, 2, 4) and auto["sag"] in ("bruck", "recursive")
    assert len(auto["auto_probe"]) == 7 and auto["layout"] in ("block", "strided")
    assert "spardl(d=auto) chose d=" in capsys.readouterr().out


@pytest.mark.mpi
def test_a_teams_auto_row_chooses_under_mpiexec(tmp_path):
    path = tmp_path / "rows.json"
    result = mpiexec(
        2,
        SCRIPT,
        *("--numel", "2001", "--iters", "1", "--warmup", "0", "--methods", "spardl"),
        *("--teams", "auto", "--json", str(path)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(path.read_text())[0]
    assert row["teams_requested"] == "auto" and row["teams"] in (1, 2)
    assert [entry["teams"] for entry in row["auto_probe"]] == [1, 2, 2]
