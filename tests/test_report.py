"""The report script on the hand-written runs in tests/data/runs (values chosen to check by hand).

Per iteration: spardl 200 ms (sync 100), topk 300 ms (sync 200), dense 400 ms (sync 300); the
dense file has no ``epoch_iters`` or ``eval_seconds``, as an older trainer wrote.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from mpirun import ROOT

from trainreport import cli
from trainreport import runs as report_runs
from trainreport.plots import FIGURES

RUNS = [os.path.join(ROOT, "tests", "data", "runs", name) for name in ("spardl", "topk", "dense")]


def table_rows(text: str, first_cell: str) -> list:
    """The cells of every Markdown row whose first cell is ``first_cell``."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith(f"| {first_cell} |")
    ]


def test_time_table_split_and_speedups():
    text = cli.main(RUNS)
    assert "## model cnn, dataset digits, workers 4\n" in text
    assert "| run | density | teams | sag | ms/iter |" in text
    (spardl_time, spardl_acc), (topk_time, _), (dense_time, dense_acc) = (
        table_rows(text, name) for name in ("spardl", "topk", "dense")
    )
    assert spardl_time == [
        "spardl",
        "0.01",
        "-",
        "-",
        "200.0",
        "100.0",
        "40.0",
        "50.0",
        "10.0",
        "100.0",
        "100.0",
        "0.0%",
        "0.0",
        "0.100",
        "1.00x",
        "1.00x",
    ]
    assert topk_time[4] == "300.0" and topk_time[-2:] == ["1.50x", "2.00x"]
    assert dense_time[4] == "400.0" and dense_time[-2:] == ["2.00x", "3.00x"]
    assert spardl_acc == ["spardl", "3", "0.9200", "0.9200", "0.3000", "0.3500", "7.5"]
    assert dense_acc[-1] == "12.0"  # no eval_seconds: training time only


def test_out_dir_gets_markdown_and_plots(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [
            sys.executable,
            os.path.join("scripts", "report.py"),
            *RUNS,
            "--out",
            str(tmp_path),
            "--target-accuracy",
            "0.9",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "report.md").read_text().strip() == result.stdout.strip()
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 10_000
        assert f"![{name[:-4]}]({name})" in result.stdout


def test_labels_stay_unique_and_groups_split(tmp_path):
    second = tmp_path / "spardl_again"
    shutil.copytree(RUNS[0], second)
    other = tmp_path / "other_model"
    other.mkdir()
    rows = [
        dict(json.loads(line), model="mlp") for line in open(os.path.join(RUNS[1], "metrics.jsonl"))
    ]
    (other / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = cli.main([RUNS[0], str(second), str(other)])
    assert table_rows(text, "spardl #1") and table_rows(text, "spardl #2")  # not their folders
    assert "spardl_again" not in text
    assert "## model mlp, dataset digits, workers 4" in text
    assert table_rows(text, "topk")[0][-2:] == ["-", "-"]  # no spardl run in its group


def test_missing_or_broken_runs_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as missing:
        cli.main([str(tmp_path)])
    assert missing.value.code == 2 and "no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit) as broken:
        cli.main([str(tmp_path)])
    assert broken.value.code == 2 and "not JSON" in capsys.readouterr().err


def write_rows(directory, rows):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(directory)


def spardl_rows():
    return [json.loads(line) for line in open(os.path.join(RUNS[0], "metrics.jsonl"))]


def test_same_directory_names_under_different_parents_get_distinct_labels(tmp_path):
    """Repeats (same recorded settings) are numbered in the order given, not named by path."""
    first = write_rows(tmp_path / "seed1" / "spardl", spardl_rows())
    second = write_rows(tmp_path / "seed2" / "spardl", spardl_rows())
    text = cli.main([first, second, first])
    for number in (1, 2, 3):
        assert len(table_rows(text, f"spardl #{number}")) == 2  # time and accuracy tables
    assert "seed1" not in text and "seed2" not in text


def test_rows_superseded_by_a_rerun_or_a_resume_are_left_out(tmp_path, capsys):
    rows = spardl_rows()  # epochs 1, 2, 3
    rerun = write_rows(tmp_path / "rerun", rows + rows[:2])
    resumed = write_rows(tmp_path / "resumed", rows + [dict(rows[2], test_acc=0.5)])
    runs = [report_runs.load_run(rerun), report_runs.load_run(resumed)]
    assert [r["epoch"] for r in runs[0].rows] == [1, 2] and runs[0].wall_times() == report_runs.Run(
        "x", rows[:2]
    ).wall_times()
    assert [r["epoch"] for r in runs[1].rows] == [1, 2, 3] and runs[1].rows[-1]["test_acc"] == 0.5
    err = capsys.readouterr().err
    assert "3 of 5 rows superseded" in err and "1 of 4 rows superseded" in err


def test_rows_within_an_epoch_are_kept_and_a_resume_still_supersedes(tmp_path):
    def row(epoch, iters, **extra):
        return {"epoch": epoch, "iters": iters, "epoch_iters": 1, "test_acc": 0.1, **extra}

    within = [row(1, 2, within_epoch=True), row(1, 4), row(2, 6, within_epoch=True), row(2, 8)]
    assert report_runs.latest_history(within) == within
    resumed = within + [row(2, 6, test_acc=0.9, within_epoch=True), row(2, 8, test_acc=0.9)]
    assert report_runs.latest_history(resumed) == within[:2] + resumed[4:]


def test_epoch_iters_alone_is_enough_and_bad_rows_name_the_file(tmp_path, capsys):
    rows = [{k: v for k, v in row.items() if k != "iters"} for row in spardl_rows()]
    assert report_runs.load_run(write_rows(tmp_path / "no_iters", rows)).epoch_iters() == [
        10,
        10,
        10,
    ]
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    lacking = write_rows(
        tmp_path / "lacking",
        [{k: v for k, v in rows[0].items() if k not in ("comm_seconds", "epoch_iters")}],
    )
    null_time = write_rows(tmp_path / "null_time", [dict(rows[0], sync_seconds=None)])
    text_epoch = write_rows(tmp_path / "text_epoch", [dict(rows[0], epoch="1", test_acc=None)])
    for path, message in (
        (str(tmp_path / "list.jsonl"), "list.jsonl: row 1 is not a JSON object"),
        (lacking, "metrics.jsonl: row 1 lacks comm_seconds, iters"),
        (null_time, "row 1: sync_seconds null should be a number"),
        (text_epoch, 'row 1: epoch "1" should be a number'),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main([path])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_reference_without_runs_is_reported_and_several_are_named(tmp_path, capsys):
    cli.main(RUNS + ["--reference", "SparDL"])
    assert (
        "no run of --reference SparDL, so no speedups; methods here: dense, spardl, topk"
        in capsys.readouterr().err
    )
    rows = [dict(row, density=0.05) for row in spardl_rows()]
    text = cli.main([RUNS[0], write_rows(tmp_path / "dense_spardl", rows)])
    assert "speedup = this run's time / spardl (spardl (density 0.01))'s." in text


def test_a_cut_off_last_line_is_skipped_and_a_broken_middle_line_named(tmp_path, capsys):
    rows = spardl_rows()
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "metrics.jsonl").write_text(text + json.dumps(rows[-1])[:40])
    cli.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert f"line {len(rows) + 1} is cut off" in err
    lines = text.splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "{oops\n" + "".join(lines[1:]))
    with pytest.raises(SystemExit) as broken:
        cli.main([str(tmp_path)])
    assert broken.value.code == 2 and "line 2 is not JSON" in capsys.readouterr().err


def test_a_run_that_stopped_early_is_marked(tmp_path, capsys):
    rows = [dict(row, max_epochs=400) for row in spardl_rows()]
    text = cli.main([write_rows(tmp_path / "spardl", rows)])
    assert f"stopped after epoch {rows[-1]['epoch']} of 400" in capsys.readouterr().err
    assert table_rows(text, "spardl")[1][1] == f"{rows[-1]['epoch']} of 400"


def test_a_run_without_iterations_and_an_out_path_that_is_a_file_exit_2(tmp_path, capsys):
    rows = [dict(row, epoch_iters=0) for row in spardl_rows()]
    with pytest.raises(SystemExit) as empty:
        cli.main([write_rows(tmp_path / "spardl", rows)])
    assert empty.value.code == 2 and "no training iterations logged" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as out:
        cli.main([RUNS[0], "--out", str(tmp_path / "file")])
    assert out.value.code == 2 and "--out" in capsys.readouterr().err


def test_time_to_target_accuracy_and_the_reference_speedup_in_it(capsys):
    """Per epoch: spardl 2.5 s (acc 0.80, 0.90, 0.92), topk 3.5 s (0.78, 0.88, 0.91), dense 4 s
    with no evaluation time (0.82, 0.91, 0.93)."""
    text = cli.main(RUNS + ["--target-accuracy", "0.9"])
    assert "| epoch to 0.9 | wall s to 0.9 | spardl speedup to 0.9 |" in text
    (_, spardl), (_, topk), (_, dense) = (
        table_rows(text, name) for name in ("spardl", "topk", "dense")
    )
    assert spardl[-3:] == ["2", "5.0", "1.00x"]
    assert topk[-3:] == ["3", "10.5", "2.10x"]
    assert dense[-3:] == ["2", "8.0", "1.60x"]
    text = cli.main(RUNS + ["--target-accuracy", "0.93"])  # only dense gets there
    (_, spardl), (_, dense) = (table_rows(text, name) for name in ("spardl", "dense"))
    assert spardl[-3:] == ["not reached", "-", "-"] and dense[-3:] == ["3", "12.0", "-"]
    assert "epoch to" not in cli.main(RUNS)
    for bad in ("0", "90", "-0.5"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(RUNS + ["--target-accuracy", bad])
        assert (
            exit_.value.code == 2
            and "--target-accuracy takes a fraction in (0, 1]" in capsys.readouterr().err
        )


def test_runs_are_labelled_and_given_columns_by_their_settings_not_their_folders(tmp_path):
    """Runs of one method that differ in teams or SAG variant are labelled by those settings
    (whatever their folders are called), and each setting gets its column."""
    runs = [
        write_rows(tmp_path / name, [dict(row, teams=teams, sag=sag) for row in spardl_rows()])
        for name, teams, sag in (("a", 1, "bruck"), ("b", 2, "bruck"), ("c", 2, "recursive"))
    ]
    text = cli.main(runs + [RUNS[1]])
    first, second, third = (
        table_rows(text, f"spardl (teams {teams}, sag {sag})")
        for teams, sag in ((1, "bruck"), (2, "bruck"), (2, "recursive"))
    )
    assert first[0][1:4] == ["0.01", "1", "bruck"] and third[0][1:4] == ["0.01", "2", "recursive"]
    assert len(second) == 2 and table_rows(text, "topk")[0][1:4] == ["0.01", "-", "-"]
    assert "speedup = this run's time / spardl (spardl (teams 1, sag bruck))'s." in text
    srs = write_rows(tmp_path / "srs", [dict(row, srs="ring") for row in spardl_rows()])
    text = cli.main([srs, RUNS[1]])
    assert "| run | density | teams | sag | srs | ms/iter |" in text  # shown once a run records it
    assert table_rows(text, "spardl")[0][1:5] == ["0.01", "-", "-", "ring"]


def test_the_wire_labels_runs_and_gets_a_column_once_a_run_is_not_fp32(tmp_path):
    """A run that records no wire sent fp32 (it ran before the wire existed)."""
    fp32 = write_rows(tmp_path / "a", [dict(row, wire="fp32") for row in spardl_rows()])
    text = cli.main([fp32, RUNS[0], RUNS[1]])
    assert "wire" not in text and len(table_rows(text, "spardl #1")) == 2  # repeats
    fp16 = write_rows(tmp_path / "b", [dict(row, wire="fp16") for row in spardl_rows()])
    text = cli.main([fp32, fp16, RUNS[1]])
    assert "| run | density | teams | sag | wire | ms/iter |" in text
    assert table_rows(text, "spardl (wire fp16)")[0][1:5] == ["0.01", "-", "-", "fp16"]
    assert table_rows(text, "spardl (wire fp32)")[0][4] == "fp32"
    assert table_rows(text, "topk")[0][4] == "fp32"


def test_networks_are_never_mixed_and_a_sweep_compares_them(tmp_path):
    """Per iteration: spardl 200 ms and topk 300 ms on 1gbit; on 100mbit twice as long for topk."""

    def on(network, source, scale=1.0):
        rows = [
            dict(row, network=network, epoch_seconds=row["epoch_seconds"] * scale)
            for row in map(json.loads, open(os.path.join(source, "metrics.jsonl")))
        ]
        return write_rows(tmp_path / f"{network}_{os.path.basename(source)}", rows)

    text = cli.main(
        [
            on("1gbit", RUNS[0]),
            on("1gbit", RUNS[1]),
            on("100mbit", RUNS[0]),
            on("100mbit", RUNS[1], scale=2.0),
        ]
    )
    assert "## model cnn, dataset digits, workers 4, network 1gbit\n" in text
    assert "## model cnn, dataset digits, workers 4, network 100mbit\n" in text
    assert [row[-2] for row in table_rows(text, "topk") if len(row) > 7] == ["1.50x", "3.00x"]
    assert "## model cnn, dataset digits, workers 4: time per iteration by network" in text
    assert table_rows(text, "1gbit") == [["1gbit", "200.0 (1.00x)", "300.0 (1.50x)"]]
    assert table_rows(text, "100mbit") == [["100mbit", "200.0 (1.00x)", "600.0 (3.00x)"]]
    assert "by network" not in cli.main(RUNS)  # one network: no sweep


def test_the_script_without_the_package_says_to_install_it(tmp_path):
    result = subprocess.run(
        [sys.executable, "-S", os.path.join(ROOT, "scripts", "report.py"), *RUNS],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "run `pip install -e .`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_measured_compute_splits_off_the_rest_of_an_iteration(tmp_path):
    """spardl: 200 ms per iteration, 100 ms of it synchronization; with compute_seconds 0.6 s per
    10-iteration epoch, 60 ms is compute and 40 ms the rest (loading, optimizer, start-up)."""
    rows = [dict(row, compute_seconds=0.6) for row in spardl_rows()]
    text = cli.main([write_rows(tmp_path / "spardl", rows)])
    header = (
        "| ms/iter | compute | select | comm | other sync | sync | exposed | overlap | rest | "
        "MB/iter |"
    )
    assert header in text
    assert table_rows(text, "spardl")[0][4:14] == [
        "200.0",
        "60.0",
        "40.0",
        "50.0",
        "10.0",
        "100.0",
        "100.0",  # rows without exposed_sync_seconds: all of it
        "0.0%",
        "40.0",
        "0.100",
    ]


def test_overlapped_runs_count_only_the_exposed_synchronization_in_the_rest(tmp_path):
    """The same run overlapped: 100 ms of synchronization, 30 ms of it after compute ended; the
    rest is what is neither compute (60 ms) nor exposed synchronization: 110 ms."""
    rows = [
        dict(row, compute_seconds=0.6, exposed_sync_seconds=0.3, overlap=True)
        for row in spardl_rows()
    ]
    text = cli.main([write_rows(tmp_path / "spardl", rows)])
    cells = table_rows(text, "spardl")[0]
    start = cells.index("200.0")
    assert cells[start : start + 9] == [
        "200.0",
        "60.0",
        "40.0",
        "50.0",
        "10.0",
        "100.0",
        "30.0",
        "70.0%",  # of the synchronization hidden behind compute
        "110.0",
    ]


def test_masked_lm_runs_are_labelled_masked_token_accuracy_with_perplexity(tmp_path):
    """BERT's rows (task masked-lm) report masked-token accuracy, the MLM loss and perplexity;
    classification runs keep their headers."""
    bert = [
        dict(
            row,
            model="bert-tiny",
            dataset="wikipedia",
            task="masked-lm",
            test_perplexity=2.5 + row["epoch"],
        )
        for row in spardl_rows()
    ]
    text = cli.main([write_rows(tmp_path / "bert", bert), RUNS[1]])
    assert (
        "| run | epochs | final masked-token acc | best masked-token acc | final train MLM loss | "
        "final test MLM loss | final test perplexity | wall s |" in text
    )
    assert "Accuracy is masked-token accuracy" in text
    assert table_rows(text, "spardl")[1][:3] + table_rows(text, "spardl")[1][6:] == [
        "spardl",
        "3",
        "0.9200",
        "5.50",
        "7.5",
    ]
    assert (
        "| run | epochs | final test acc | best test acc | final train loss | final test loss "
        "| wall s |" in text
    )
    from trainreport.runs import accuracy_name, load_run

    assert accuracy_name([load_run(str(tmp_path / "bert"))]) == "masked-token accuracy"
    assert accuracy_name([load_run(RUNS[1])]) == "test accuracy"
