#!/usr/bin/env python
"""Paper-style tables and plots from the ``metrics.jsonl`` of several training runs.

    .venv/bin/python scripts/report.py runs/vgg16_spardl runs/vgg16_oktopk runs/vgg16_dense --out report/

Each RUN_DIR holds the trainer's ``metrics.jsonl`` (one JSON object per epoch, CONTRACT
section 2). Runs are grouped by (model, dataset, workers) where the rows say so; within a group:

- **time per iteration** (the paper's time-breakdown table): training seconds per iteration and
  their split into compute (``epoch_seconds - sync_seconds``), selection, communication and the
  rest of synchronization (packing, accumulation), megabytes sent per rank per iteration, and the
  speedup of the reference method (``--reference``, default spardl) over every run, in total
  time and in synchronization time;
- **accuracy**: final and best test accuracy, final train and test loss, epochs, wall time;
  with ``--target-accuracy A`` also the epoch and wall time at which each run first reached test
  accuracy A (the paper's time-to-accuracy), and the reference method's speedup in that time.

Iterations per epoch are ``epoch_iters`` when present, else the difference of the cumulative
``iters``. A ``metrics.jsonl`` written before the trainer started a fresh file per run can hold
rows that a later run in the same directory, or a resume from an earlier checkpoint, superseded
(the epoch number goes back): only the latest history counts, and a note on stderr says how many
rows were left out. The Markdown goes to stdout and, with ``--out DIR``, to ``DIR/report.md``
together with ``accuracy_vs_epoch.png``, ``accuracy_vs_time.png`` and ``time_split.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field


@dataclass
class Run:
    """One training run: its label, its group key and its per-epoch rows."""

    path: str
    rows: list
    label: str = ""
    group: tuple = field(default_factory=tuple)

    @property
    def method(self) -> str:
        """The synchronization method of the run (``dense`` when none is named)."""
        return self.rows[-1].get("compressor") or "dense"

    def epoch_iters(self) -> list:
        """Iterations of every epoch."""
        previous, counts = 0, []
        for row in self.rows:
            count = row["epoch_iters"] if "epoch_iters" in row else row["iters"] - previous
            counts.append(count)
            previous = row.get("iters", previous + count)
        return counts

    def per_iteration(self) -> dict:
        """Mean seconds (and bytes) per iteration over the run: total, compute, select, comm, other
        (the rest of synchronization), sync, bytes."""
        iters = sum(self.epoch_iters())  # >= 1: load_run checks
        total = sum(r["epoch_seconds"] for r in self.rows) / iters
        sync = sum(r["sync_seconds"] for r in self.rows) / iters
        select = sum(r["select_seconds"] for r in self.rows) / iters
        comm = sum(r["comm_seconds"] for r in self.rows) / iters
        return {"total": total, "compute": total - sync, "select": select, "comm": comm,
                "other": sync - select - comm, "sync": sync,
                "bytes": sum(r["bytes_sent_per_rank"] for r in self.rows) / iters}

    def wall_times(self) -> list:
        """Cumulative wall seconds (training plus evaluation) at the end of every epoch."""
        elapsed, times = 0.0, []
        for row in self.rows:
            elapsed += row["epoch_seconds"] + row.get("eval_seconds", 0.0)
            times.append(elapsed)
        return times

    def time_to(self, target: float):
        """``(epoch, wall seconds)`` at the end of the first epoch whose test accuracy is at
        least ``target``; ``None`` if no epoch reached it."""
        for row, seconds in zip(self.rows, self.wall_times()):
            if row.get("test_acc") is not None and row["test_acc"] >= target:
                return row["epoch"], seconds
        return None


REQUIRED = ("epoch", "epoch_seconds", "sync_seconds", "select_seconds", "comm_seconds", "bytes_sent_per_rank")
#: Keys the report computes with, where a row has them: numbers ...
NUMBERS = REQUIRED + ("iters", "epoch_iters", "max_epochs", "eval_seconds")
#: ... and numbers or null (an epoch without evaluation).
NULLABLE = ("test_acc", "test_loss", "train_loss")


def _is_number(value) -> bool:
    """Whether a metrics value is a JSON number (not ``true`` or ``false``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_run(path: str) -> Run:
    """Read ``path/metrics.jsonl`` (or ``path`` itself if it is a file) and keep its latest
    history (:func:`latest_history`); ``ValueError`` if it is missing, empty, not JSON lines of
    objects, or a row lacks a key the report needs."""
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"{path}: no metrics.jsonl")
    with open(file) as handle:
        lines = [(number, line) for number, line in enumerate(handle, 1) if line.strip()]
    rows = []
    for number, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == lines[-1][0] and not line.endswith("\n"):  # cut off mid-write
                print(f"note: {file}: line {number} is cut off (the run stopped while writing it); "
                      "reporting the lines before it", file=sys.stderr)
                break
            raise ValueError(f"{file}: line {number} is not JSON ({error.msg}, column {error.colno})") from None
    if not rows:
        raise ValueError(f"{file}: no epochs logged")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{file}: row {number} is not a JSON object")
        missing = [key for key in REQUIRED if key not in row] + \
            ([] if "iters" in row or "epoch_iters" in row else ["iters"])
        if missing:
            raise ValueError(f"{file}: row {number} lacks {', '.join(missing)}")
        wrong = [key for key in NUMBERS + NULLABLE if key in row and not _is_number(row[key])
                 and not (key in NULLABLE and row[key] is None)]
        if wrong:
            raise ValueError(f"{file}: row {number}: {', '.join(f'{key} {json.dumps(row[key])}' for key in wrong)} "
                             "should be a number")
    latest = latest_history(rows)
    if sum(Run(path, latest).epoch_iters()) < 1:
        raise ValueError(f"{file}: no training iterations logged")
    last = latest[-1]
    if last.get("max_epochs", last["epoch"]) > last["epoch"]:
        print(f"note: {file}: the run stopped after epoch {last['epoch']} of {last['max_epochs']} "
              "(killed, crashed, or still running): its numbers are not final", file=sys.stderr)
    if len(latest) < len(rows):
        print(f"note: {file}: {len(rows) - len(latest)} of {len(rows)} rows superseded by a later run "
              f"or resume in the same directory; reporting the latest {len(latest)} epochs", file=sys.stderr)
    return Run(path=path.rstrip("/"), rows=latest)


def latest_history(rows: list) -> list:
    """The rows of the latest run: wherever the epoch number goes back (a new run, or a resume
    from an earlier checkpoint), the rows it repeats or restarts are dropped."""
    kept: list = []
    for row in rows:
        while kept and kept[-1]["epoch"] >= row["epoch"]:
            kept.pop()
        kept.append(row)
    return kept


def label_runs(runs: list) -> list:
    """Set every run's group (model, dataset, workers) and a label unique within its group: the
    method, with the density, then the directory name, then the path as given and last a number
    added where that is needed."""
    for run in runs:
        last = run.rows[-1]
        run.group = tuple((name, last[key]) for name, key in (("model", "model"), ("dataset", "dataset"),
                                                               ("workers", "nworkers")) if key in last)
        run.label = run.method
    for extra in (lambda r, _: f"{r.method} ({r.rows[-1].get('density')})",
                  lambda r, _: f"{r.method} ({os.path.basename(r.path)})",
                  lambda r, _: f"{r.method} ({r.path})",
                  lambda r, number: f"{r.label} #{number}"):
        seen: dict = {}
        for run in runs:
            seen.setdefault((run.group, run.label), []).append(run)
        for clashing in (group for group in seen.values() if len(group) > 1):
            for number, run in enumerate(clashing, 1):
                run.label = extra(run, number)
    return runs


def group_title(key: tuple) -> str:
    """``model cnn, dataset digits, workers 4`` for a group key."""
    return ", ".join(f"{name} {value}" for name, value in key) or "runs"


def groups(runs: list) -> dict:
    """Runs by group key, in first-seen order."""
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(run.group, []).append(run)
    return grouped


def markdown(runs: list, reference: str, target: float = None) -> str:
    """The two tables per group as Markdown (``target``: see :func:`accuracy_table`)."""
    out = []
    for key, members in groups(runs).items():
        out.append(f"## {group_title(key)}\n")
        out.append(time_table(members, reference))
        out.append(accuracy_table(members, reference, target))
    return "\n".join(out)


def reference_run(runs: list, reference: str):
    """The group's first run of the ``reference`` method, whose times the speedups divide;
    ``None`` if the group has none."""
    return next((run for run in runs if run.method == reference), None)


def time_table(runs: list, reference: str) -> str:
    """Time per iteration and its split, and the reference method's speedup over each run (the
    group's first run of that method, named above the table when there are several)."""
    base = reference_run(runs, reference)
    ref = base.per_iteration() if base else None
    which = f" ({base.label})" if sum(run.method == reference for run in runs) > 1 else ""
    lines = [f"Time per iteration (ms); speedup = this run's time / {reference}{which}'s.\n",
             "| method | density | ms/iter | compute | select | comm | other sync | sync | MB/iter | "
             f"{reference} speedup | {reference} sync speedup |",
             "|---|" + "---:|" * 10]
    for run in runs:
        t = run.per_iteration()
        speedups = [_ratio(t[key], ref[key]) if ref else "-" for key in ("total", "sync")]
        lines.append(f"| {run.label} | {run.rows[-1].get('density', '-')} | " + " | ".join(f"{t[key] * 1e3:.1f}" for key in
                                                       ("total", "compute", "select", "comm", "other", "sync"))
                     + f" | {t['bytes'] / 1e6:.3f} | {speedups[0]} | {speedups[1]} |")
    return "\n".join(lines) + "\n"


def accuracy_table(runs: list, reference: str = "spardl", target: float = None) -> str:
    """Final and best test accuracy, final losses, epochs ("63 of 400" for a run that stopped
    early) and wall time per run; with a ``target`` accuracy also the epoch and wall time at
    which each run first reached it and the ``reference`` method's speedup in that time (this
    run's time / the group's first reference run's)."""
    header = "| method | epochs | final test acc | best test acc | final train loss | final test loss | wall s |"
    if target is not None:
        header += f" epoch to {target:g} | wall s to {target:g} | {reference} speedup to {target:g} |"
    lines = [header, "|---|" + "---:|" * (header.count("|") - 2)]
    base = reference_run(runs, reference)
    reference_time = base.time_to(target) if target is not None and base else None
    for run in runs:
        last = run.rows[-1]
        accuracies = [r["test_acc"] for r in run.rows if r.get("test_acc") is not None]
        epochs = f"{last['epoch']}" + (f" of {last['max_epochs']}" if last.get("max_epochs", 0) > last["epoch"] else "")
        line = (f"| {run.label} | {epochs} | {_number(last.get('test_acc'), 4)} | "
                f"{_number(max(accuracies) if accuracies else None, 4)} | {_number(last.get('train_loss'), 4)} | "
                f"{_number(last.get('test_loss'), 4)} | {run.wall_times()[-1]:.1f} |")
        if target is not None:
            reached = run.time_to(target)
            if reached is None:
                line += " not reached | - | - |"
            else:
                speedup = _ratio(reached[1], reference_time[1]) if reference_time else "-"
                line += f" {reached[0]} | {reached[1]:.1f} | {speedup} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference > 0 else "-"


def _number(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot(runs: list, out_dir: str, target: float = None) -> list:
    """Write the three figures (one column per group) into ``out_dir``, with a dashed line at
    the ``target`` accuracy if one is given; return their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    grouped = list(groups(runs).items())
    paths = []
    for name, x_of in (("accuracy_vs_epoch", lambda r: [row["epoch"] for row in r.rows]),
                       ("accuracy_vs_time", Run.wall_times)):
        fig, axes = plt.subplots(1, len(grouped), figsize=(5.5 * len(grouped), 4), squeeze=False)
        for axis, (key, members) in zip(axes[0], grouped):
            for run in members:
                points = [(x, row["test_acc"]) for x, row in zip(x_of(run), run.rows) if row.get("test_acc") is not None]
                if points:
                    axis.plot(*zip(*points), marker=".", label=run.label)
            axis.set(xlabel="epoch" if name.endswith("epoch") else "wall time (s)", ylabel="test accuracy",
                     title=group_title(key))
            if axis.lines:
                if target is not None:
                    axis.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
                axis.legend(fontsize=8)
            else:
                axis.text(0.5, 0.5, "no test accuracy logged", ha="center", transform=axis.transAxes)
        paths.append(_save(fig, plt, out_dir, name))
    width = max(4.5, 1.5 + 1.3 * max(len(m) for _, m in grouped))  # per group: room for its title
    fig, axes = plt.subplots(1, len(grouped), figsize=(width * len(grouped), 4), squeeze=False)
    for axis, (key, members) in zip(axes[0], grouped):
        bottom = [0.0] * len(members)
        for part in ("compute", "select", "comm", "other"):
            heights = [run.per_iteration()[part] * 1e3 for run in members]
            axis.bar([run.label for run in members], heights, bottom=bottom, label=part)
            bottom = [b + h for b, h in zip(bottom, heights)]
        axis.set(ylabel="ms per iteration", title=group_title(key))
        axis.tick_params(axis="x", rotation=30)
        axis.legend(fontsize=8)
    paths.append(_save(fig, plt, out_dir, "time_split"))
    return paths


def _save(fig, plt, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> str:
    """Print the report; with ``--out`` also write report.md and the plots. Returns the Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="directories holding metrics.jsonl")
    parser.add_argument("--out", metavar="DIR", help="also write report.md and the plots into DIR")
    parser.add_argument("--reference", default="spardl",
                        help="method whose speedup is reported (default: %(default)s)")
    parser.add_argument("--target-accuracy", type=float, metavar="A",
                        help="also report when each run first reached test accuracy A (a fraction "
                             "in (0, 1], e.g. 0.9) and the reference's speedup in that time")
    args = parser.parse_args(argv)
    if args.target_accuracy is not None and not 0.0 < args.target_accuracy <= 1.0:
        parser.error(f"--target-accuracy takes a fraction in (0, 1] (test accuracy as logged, "
                     f"e.g. 0.9 for 90%), got {args.target_accuracy}")
    if args.out:  # made now, so that a path that cannot be one fails before any work
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as error:
            parser.error(f"--out {args.out}: {error.strerror}")
        if not os.access(args.out, os.W_OK):
            parser.error(f"--out {args.out}: not writable")
    try:
        runs = label_runs([load_run(path) for path in args.runs])
        text = markdown(runs, args.reference, args.target_accuracy)
    except ValueError as error:
        parser.exit(2, f"report.py: {error}\n")
    if all(run.method != args.reference for run in runs):
        print(f"note: no run of --reference {args.reference}, so no speedups; methods here: "
              f"{', '.join(sorted({run.method for run in runs}))}", file=sys.stderr)
    print(text)
    if args.out:
        with open(os.path.join(args.out, "report.md"), "w") as handle:
            handle.write(text)
        plot(runs, args.out, args.target_accuracy)
    return text


if __name__ == "__main__":
    main()
