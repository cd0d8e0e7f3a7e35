"""The simulator's replayed local-work term (--local-work replay): the fit, its use in place of
the selection term, the option's checks. Tiny sizes only."""

import json
import re

import pytest
from entry_points import load_script

from syncbench import local_work
from syncbench.local_work import LinearFit, ReplayedLocalWork, fit

simulate = load_script("simulate")


def test_the_fit_reproduces_a_linear_case_exactly():
    fixed, per_entry = 2e-3, 3e-9
    points = [(n, fixed + per_entry * n) for n in (1_000, 4_000)]
    fitted = fit(points)
    assert (fitted.fixed, fitted.per_entry) == pytest.approx((fixed, per_entry), rel=1e-9)
    assert fitted.seconds(14_728_266) == pytest.approx(fixed + per_entry * 14_728_266, rel=1e-9)
    three = fit(
        points + [(10_000, fixed + per_entry * 10_000)]
    )  # least squares through collinear points
    assert (three.fixed, three.per_entry) == pytest.approx((fixed, per_entry), rel=1e-9)


def test_the_fit_stays_non_negative():
    with pytest.warns(UserWarning, match="local-work fit failed: the larger sizes ran faster"):
        failed = fit([(1000, 1.0), (4000, 0.5)])  # slower when smaller: a fixed mean, flagged
    assert failed == LinearFit(0.75, 0.0, failed=True)
    through_origin = fit([(1000, 0.5), (2000, 2.0)])  # the line would start at -1 s
    assert through_origin.fixed == 0 and through_origin.per_entry == pytest.approx(
        (500 + 4000) / (1e6 + 4e6)
    )
    assert fit([(1000, 2.0), (1000, 4.0)]) == LinearFit(0.0, 3e-3)


def test_the_sizes_are_the_simulated_n_or_the_given_one_and_a_quarter_of_it():
    assert ReplayedLocalWork().sizes(4096, 30_000, lambda n: n + 1) == (4097, 1025)
    assert ReplayedLocalWork(numel=40_000).sizes(4096, 100_000, lambda n: n) == (40_000, 10_000)
    assert ReplayedLocalWork(numel=40_000).sizes(4096, 30_000, lambda n: n) == (
        30_000,
        7_500,
    )  # <= the model's


ARGS = [
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
    "--host-cores",
    "1",
]


def test_the_replayed_term_replaces_the_selection_term(monkeypatch, capsys):
    """With a stand-in replay of 1 ms + 100 ns per entry: 4 ms at n = 30,000, times the compute
    share 2 (2 ranks on 1 core) = 8 ms, added to the network time instead of the selection."""
    replays = []

    def fake(name, options, workers, numel, density, call, seed, repeats, group=None):
        replays.append((name, workers, numel, call))
        return 1e-3 + 1e-7 * numel

    monkeypatch.setattr(local_work, "replay_seconds", fake)
    [selected], _ = simulate.main(ARGS)
    assert (
        "local work: selection only (--local-work select, the default)" in capsys.readouterr().out
    )
    assert selected["local_work"] == "select" and selected["local_ms"] == selected["select_ms"] > 0
    assert selected["predicted_ms"] == pytest.approx(selected["network_ms"] + selected["select_ms"])
    assert replays == []
    [replayed], _ = simulate.main(ARGS + ["--local-work", "replay"])
    assert "local work: replayed (--local-work replay)" in capsys.readouterr().out
    # the simulated n, 4096 rounded up to 2 blocks of 2100 (21 entries kept), and 1024 likewise
    assert [(n, call) for _, _, n, call in replays] == [
        (4200, 1),
        (1200, 1),
    ]  # topk: call 1 weighs all
    assert replayed["local_work"] == "replay" and replayed["compute_share"] == 2.0
    assert (replayed["local_fixed_ms"], replayed["local_per_entry_ns"]) == pytest.approx(
        (1.0, 100.0)
    )
    assert replayed["local_ms"] == pytest.approx(8.0)
    assert replayed["select_ms"] == pytest.approx(selected["select_ms"])  # reported, not added
    assert replayed["network_ms"] == pytest.approx(selected["network_ms"])
    assert replayed["predicted_ms"] == pytest.approx(replayed["network_ms"] + 8.0)


def test_compare_reports_the_replayed_local_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(local_work, "replay_seconds", lambda *args, **kwargs: 1e-3)
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(
            [
                {
                    "method": "topk",
                    "label": "topk",
                    "workers": 2,
                    "numel": 30_000,
                    "density": 0.01,
                    "median_ms": 4.0,
                    "network": "1gbit",
                }
            ]
        )
    )
    [row], _ = simulate.main(
        [
            "--compare",
            str(path),
            "--numel",
            "4096",
            "--local-work",
            "replay",
            "--local-numel",
            "100000",
            "--host-cores",
            "1",
        ]
    )
    assert row["local_work"] == "replay" and row["predicted_local_ms"] == pytest.approx(
        2.0
    )  # 1 ms, share 2
    assert row["predicted_ms"] == pytest.approx(row["predicted_network_ms"] + 2.0)
    out = capsys.readouterr().out
    assert "at n = 100,000 (at most the model's n) and a 4th of it" in out and "pred local" in out


@pytest.mark.filterwarnings("ignore:local-work fit failed")  # tiny sizes: timing noise
def test_a_real_replay_is_timed_at_two_sizes():
    [row], _ = simulate.main(ARGS + ["--local-work", "replay"])
    (large, large_ms), (small, small_ms) = row["local_points"]
    assert (large, small) == (4200, 1200) and large_ms > 0 and small_ms > 0
    assert row["local_ms"] > 0 and row["predicted_ms"] == pytest.approx(
        row["network_ms"] + row["local_ms"]
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--local-work", "measured"],
            "--local-work must be one of select, replay, got 'measured'",
        ),
        (["--local-numel", "5000"], "--local-numel must be >= 1 and goes with --local-work replay"),
        (["--local-work", "replay", "--local-numel", "0"], "--local-numel must be >= 1"),
    ],
)
def test_the_option_is_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(re.escape(message), err) and err.count("error:") == 1
