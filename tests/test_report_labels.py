"""scripts/report.py labels runs by the settings their rows record, never by their folders, and
reports how much of each run's synchronization overlapped compute."""

import json
import os

from mpirun import ROOT

from trainreport import cli
from trainreport.runs import Run
from trainreport.settings import label_runs

SPARDL = os.path.join(ROOT, "tests", "data", "runs", "spardl", "metrics.jsonl")


def rows(**changes):
    """The hand-written spardl run's rows (10 iterations an epoch, 100 ms of sync each), with
    ``changes`` in every row."""
    return [dict(json.loads(line), **changes) for line in open(SPARDL)]


def write(directory, run_rows):
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run_rows))
    return str(directory)


def labels(runs):
    return [run.label for run in label_runs(runs)]


def cells(text, label):
    """The time table's cells of the run labelled ``label`` (its first table)."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_runs_differing_in_another_recorded_setting_are_labelled_by_it(tmp_path):
    """SparDL with and without momentum correction differ in its ``momentum`` option, which is
    no table column: the label names it, not the folders (``spardl`` and ``spardl_mc``)."""
    plain = write(tmp_path / "spardl", rows(momentum=0.0, batch_size=32))
    corrected = write(tmp_path / "spardl_mc", rows(momentum=0.9, batch_size=32))
    text = cli.main([plain, corrected])
    assert cells(text, "spardl (momentum 0)") and cells(text, "spardl (momentum 0.9)")
    assert "spardl_mc" not in text and "[" not in text.split("## Figures")[0]


def test_only_the_settings_that_tell_runs_apart_are_named():
    """Settings all runs share (batch size 32 below) and measurements (the loss, lr, times)
    never enter a label; a table setting (density) that already tells runs apart suffices."""
    runs = [
        Run("a", rows(batch_size=32, density=0.01, lr=0.1)),
        Run("b", rows(batch_size=32, density=0.05, lr=0.2, train_loss=9.0)),
        Run("c", rows(batch_size=64, density=0.05)),
    ]
    assert labels(runs) == [
        "spardl (density 0.01)",
        "spardl (density 0.05, batch_size 32)",
        "spardl (density 0.05, batch_size 64)",
    ]


def test_repeats_are_numbered_in_the_order_given_whatever_their_paths():
    """Seeds are not recorded in rows: runs recording the same settings are repeats."""
    runs = [Run(path, rows()) for path in ("x/seed2/spardl", "y/seed0/spardl", "z/spardl/")]
    runs.append(Run("w/topk", rows(compressor="topk")))
    assert labels(runs) == ["spardl #1", "spardl #2", "spardl #3", "topk"]
    # A setting a run does not record, against one that another does, tells them apart.
    runs = [Run("a", rows()), Run("b", rows(dense_warmup=10))]
    assert labels(runs) == ["spardl (dense_warmup -)", "spardl (dense_warmup 10)"]


def test_the_same_label_in_another_group_is_no_clash():
    runs = [Run("a", rows()), Run("b", rows(network="100mbit"))]
    assert labels(runs) == ["spardl", "spardl"]


def test_the_help_promises_what_the_labels_do(capsys):
    try:
        cli.main(["--help"])
    except SystemExit:
        pass
    help_text = " ".join(capsys.readouterr().out.split())
    assert "never by folder name" in help_text and "numbered #1, #2" in help_text
    assert "overlap" in help_text


def test_the_overlap_column_is_the_share_of_sync_hidden_behind_compute(tmp_path):
    """Per iteration 100 ms of synchronization: 25 ms of it exposed (75% overlapped), all of it
    exposed (blocking), and none at all (no synchronization time: no share)."""
    overlapped = write(tmp_path / "o", rows(exposed_sync_seconds=0.25, overlap=True))
    blocking = write(tmp_path / "b", rows(exposed_sync_seconds=1.0, overlap=False))
    idle = write(
        tmp_path / "i",
        rows(
            compressor="dense",
            sync_seconds=0.0,
            exposed_sync_seconds=0.0,
            select_seconds=0.0,
            comm_seconds=0.0,
        ),
    )
    text = cli.main([overlapped, blocking, idle])
    header = next(
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| run |") and "overlap" in line
    )
    column = header.index("overlap")
    assert header[column - 2 : column + 2] == ["sync", "exposed", "overlap", "rest"]
    assert cells(text, "spardl (overlap True)")[column - 2 : column + 1] == [
        "100.0",
        "25.0",
        "75.0%",
    ]
    assert cells(text, "spardl (overlap False)")[column - 2 : column + 1] == [
        "100.0",
        "100.0",
        "0.0%",
    ]
    assert cells(text, "dense")[column] == "-"
    assert "overlap = the share of sync hidden behind compute" in text
