"""One training run's per-epoch rows, and what the report computes from them.

The rows are as the trainer writes them to ``metrics.jsonl``; the report computes time per iteration
and its split, wall time and time to an accuracy.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from trainreport.settings import IMPLIED

__all__ = [
    "REQUIRED",
    "NUMBERS",
    "NULLABLE",
    "MASKED_LM",
    "Run",
    "accuracy_name",
    "load_run",
    "latest_history",
]

REQUIRED = (
    "epoch",
    "epoch_seconds",
    "sync_seconds",
    "select_seconds",
    "comm_seconds",
    "bytes_sent_per_rank",
)
#: Keys the report computes with, where a row has them: numbers ...
NUMBERS = REQUIRED + ("iters", "epoch_iters", "max_epochs", "eval_seconds", "compute_seconds")
#: ... and numbers or null (an epoch without evaluation).
NULLABLE = ("test_acc", "test_loss", "train_loss", "test_perplexity")
#: The task whose test accuracy is masked-token accuracy (BERT pre-training), as rows record it.
MASKED_LM = "masked-lm"


@dataclass
class Run:
    """One training run: its per-epoch rows, and the label and group key the report gives it."""

    path: str
    rows: list
    label: str = ""
    group: tuple = field(default_factory=tuple)

    @property
    def method(self) -> str:
        """The synchronization method of the run (``dense`` when none is named)."""
        return self.rows[-1].get("compressor") or "dense"

    @property
    def masked_lm(self) -> bool:
        """Whether the run is masked-language-model pre-training.

        Its ``test_acc`` is the fraction of masked held-out tokens predicted exactly, its losses the
        masked-LM loss.
        """
        return self.rows[-1].get("task") == MASKED_LM

    def setting(self, key: str):
        """The run's value of setting ``key`` (``density``, ``teams`` ...).

        ``None`` where the run does not record it, except for a setting that a run from before
        it existed had (``wire``: ``fp32``, :data:`trainreport.settings.IMPLIED`).
        """
        return self.rows[-1].get(key, IMPLIED.get(key))

    def epoch_iters(self) -> list:
        """Iterations of every epoch: ``epoch_iters``, else the steps of cumulative ``iters``."""
        previous, counts = 0, []
        for row in self.rows:
            count = row["epoch_iters"] if "epoch_iters" in row else row["iters"] - previous
            counts.append(count)
            previous = row.get("iters", previous + count)
        return counts

    def per_iteration(self) -> dict:
        """Mean seconds (and bytes) per iteration over the run.

        Total, compute (forward and backward passes), select, comm, other (the rest of
        synchronization: packing, accumulation), sync, exposed (the synchronization left after
        compute: all of it without overlap, or in rows of older trainers), rest (what is neither
        compute nor exposed synchronization: loading batches, the optimizer step, start-up),
        overlap (the share of the synchronization hidden behind compute, ``1 - exposed / sync``:
        0 without overlap; ``None`` where there was no synchronization time), bytes.

        Compute is ``compute_seconds`` where every row records it; rows of older trainers do
        not, and their compute is all that is not synchronization (rest 0).
        """
        iters = sum(self.epoch_iters())  # >= 1: load_run checks
        total = sum(r["epoch_seconds"] for r in self.rows) / iters
        sync = sum(r["sync_seconds"] for r in self.rows) / iters
        select = sum(r["select_seconds"] for r in self.rows) / iters
        comm = sum(r["comm_seconds"] for r in self.rows) / iters
        compute = (
            sum(r["compute_seconds"] for r in self.rows) / iters
            if all("compute_seconds" in r for r in self.rows)
            else total - sync
        )
        exposed = (
            sum(r["exposed_sync_seconds"] for r in self.rows) / iters
            if all("exposed_sync_seconds" in r for r in self.rows)
            else sync
        )
        return {
            "total": total,
            "compute": compute,
            "select": select,
            "comm": comm,
            "other": sync - select - comm,
            "sync": sync,
            "exposed": exposed,
            "rest": total - compute - exposed,
            "overlap": 1.0 - exposed / sync if sync > 0 else None,
            "bytes": sum(r["bytes_sent_per_rank"] for r in self.rows) / iters,
        }

    def wall_times(self) -> list:
        """Cumulative wall seconds (training plus evaluation) at the end of every epoch."""
        elapsed, times = 0.0, []
        for row in self.rows:
            elapsed += row["epoch_seconds"] + row.get("eval_seconds", 0.0)
            times.append(elapsed)
        return times

    def time_to(self, target: float):
        """``(epoch, wall seconds)`` when the test accuracy first reached ``target``.

        At the end of the first epoch whose test accuracy is at least ``target``; ``None`` if no
        epoch reached it.
        """
        for row, seconds in zip(self.rows, self.wall_times()):
            if row.get("test_acc") is not None and row["test_acc"] >= target:
                return row["epoch"], seconds
        return None


def accuracy_name(runs: list) -> str:
    """What the ``test_acc`` of ``runs`` measures, for table headers and axis labels."""
    kinds = {run.masked_lm for run in runs}
    if kinds == {True}:
        return "masked-token accuracy"
    return (
        "test accuracy" if kinds == {False} else "test accuracy (masked-token for masked-LM runs)"
    )


def _is_number(value) -> bool:
    """Whether a metrics value is a JSON number (not ``true`` or ``false``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_run(path: str) -> Run:
    """Read a run's ``metrics.jsonl`` and keep its latest history.

    Reads ``path/metrics.jsonl`` (or ``path`` itself if it is a file) and keeps its latest history
    (:func:`latest_history`); ``ValueError`` if it is missing, empty, not JSON lines of objects, or
    a row lacks a key the report needs. Notes on stderr for a cut-off last line, a run that stopped
    early and rows left out.
    """
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
                print(
                    f"note: {file}: line {number} is cut off (the run stopped while writing it); "
                    "reporting the lines before it",
                    file=sys.stderr,
                )
                break
            raise ValueError(
                f"{file}: line {number} is not JSON ({error.msg}, column {error.colno})"
            ) from None
    if not rows:
        raise ValueError(f"{file}: no epochs logged")
    for number, row in enumerate(rows, 1):
        _check_row(file, number, row)
    latest = latest_history(rows)
    if sum(Run(path, latest).epoch_iters()) < 1:
        raise ValueError(f"{file}: no training iterations logged")
    last = latest[-1]
    if last.get("max_epochs", last["epoch"]) > last["epoch"] or last.get("within_epoch"):
        print(
            f"note: {file}: the run stopped after epoch {last['epoch']} of {last['max_epochs']} "
            "(killed, crashed, or still running): its numbers are not final",
            file=sys.stderr,
        )
    if len(latest) < len(rows):
        print(
            f"note: {file}: {len(rows) - len(latest)} of {len(rows)} rows superseded by a later "
            f"run or resume in the same directory; reporting the latest {len(latest)} epochs",
            file=sys.stderr,
        )
    return Run(path=path.rstrip("/"), rows=latest)


def _check_row(file: str, number: int, row) -> None:
    """Check one row of ``file`` for what the report needs.

    ``ValueError`` naming ``file`` and the row ``number`` unless ``row`` is an object with the keys
    the report needs, numbers where it computes.
    """
    if not isinstance(row, dict):
        raise ValueError(f"{file}: row {number} is not a JSON object")
    missing = [key for key in REQUIRED if key not in row] + (
        [] if "iters" in row or "epoch_iters" in row else ["iters"]
    )
    if missing:
        raise ValueError(f"{file}: row {number} lacks {', '.join(missing)}")
    wrong = [
        key
        for key in NUMBERS + NULLABLE
        if key in row and not _is_number(row[key]) and not (key in NULLABLE and row[key] is None)
    ]
    if wrong:
        raise ValueError(
            f"{file}: row {number}: {', '.join(f'{key} {json.dumps(row[key])}' for key in wrong)} "
            "should be a number"
        )


def latest_history(rows: list) -> list:
    """The rows of the latest run.

    Wherever the position goes back (a new run, or a resume from an earlier checkpoint), the
    rows it repeats or restarts are dropped. A row's position is its epoch, then its ``iters``:
    rows of evaluations within an epoch (``--eval-every``) share their epoch's number.
    """

    def position(row):
        return row["epoch"], row.get("iters", 0)

    kept: list = []
    for row in rows:
        while kept and position(kept[-1]) >= position(row):
            kept.pop()
        kept.append(row)
    return kept
