"""scripts/simulate.py refuses, in one line and with status 2, a run that cannot fit in memory
(as the bench does), and the simulator and the bench name ``--density`` in its message."""

import json
import os
import re
import subprocess
import sys

import pytest
from entry_points import load_script

from syncbench import cli, simulator
from tests.mpirun import ROOT

simulate = load_script("simulate")
bench = load_script("bench_allreduce")


@pytest.mark.skipif(
    (cli.available_memory() or 0) > 1.5e12, reason="this host has the 1.5 TB the run needs"
)
def test_the_issue_s_run_is_refused_at_once_in_one_line():
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "simulate.py"),
            "--workers",
            "64",
            "--numel",
            "2000000000",
            "--methods",
            "spardl",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert re.fullmatch(
        r"simulate\.py: error: --numel 2000000000 needs at least 1544\.0 GB of memory on this "
        r"host to simulate P=64 \(193 float32 buffers of the simulated n=2,000,000,000: .*\), "
        r"more than the \d+\.\d GB available; use a smaller --numel or a smaller P in --workers\n",
        result.stderr,
    )


def _refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        simulate.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err


def test_the_estimate_is_checked_against_the_available_memory(monkeypatch, capsys):
    numel, workers = 100_000, 8  # simulated n: 100,000 (a whole block per rank at density 0.01)
    needed = 4 * numel * simulator.held_buffers(workers)
    assert simulator.simulated_numel(numel, workers, 0.01) == numel
    argv = ["--workers", f"2,{workers}", "--numel", str(numel), "--methods", "topk"]
    monkeypatch.setattr(cli, "available_memory", lambda: needed)
    assert simulate.parse_args(argv).workers == [2, workers]  # just fits
    monkeypatch.setattr(cli, "available_memory", lambda: needed - 1)
    err = _refused(argv, capsys)
    assert err.startswith(
        f"simulate.py: error: --numel {numel} needs at least 0.0 GB of memory on this host to "
        f"simulate P={workers} ({simulator.held_buffers(workers)} float32 buffers"
    )
    assert err.endswith("; use a smaller --numel or a smaller P in --workers\n")
    err = _refused(argv[:1] + ["2"] + argv[2:] + ["--sweep", "8"], capsys)
    assert f"to simulate P={workers} (" in err and err.endswith("a smaller P in --sweep\n")
    monkeypatch.setattr(cli, "available_memory", lambda: None)  # unknown: not refused
    assert simulate.parse_args(argv).numel == numel


def test_the_replay_size_and_compared_rows_are_checked_too(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "available_memory", lambda: 10**9)
    err = _refused(
        ["--workers", "4", "--numel", "4096", "--local-work", "replay"]
        + ["--local-numel", "100000000", "--model-numel", "100000000"],
        capsys,
    )
    assert err.startswith("simulate.py: error: --local-numel 100000000 needs at least 5.2 GB")
    row = {"method": "topk", "label": "topk", "workers": 64, "numel": 10**8, "density": 0.01}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([dict(row, median_ms=1.0, network="1gbit")]))
    err = _refused(["--compare", str(path), "--numel", str(10**8)], capsys)
    assert err.startswith("simulate.py: error: --compare: the row topk at P=64 needs at least")
    assert simulate.parse_args(["--compare", str(path)]).bench_rows  # n = 2^18: fits


@pytest.mark.parametrize("module", [simulate, bench], ids=["simulate", "bench"])
@pytest.mark.parametrize("density", ["0", "1.5", "-0.1"])
def test_a_bad_density_names_the_flag(module, density, capsys):
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(["--density", density])
    assert exit_.value.code == 2
    prog = "simulate.py" if module is simulate else "bench_allreduce.py"
    assert capsys.readouterr().err == (
        f"{prog}: error: --density must lie in (0, 1], got {float(density)}\n"
    )
