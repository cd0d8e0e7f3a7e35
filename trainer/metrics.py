"""Per-epoch measurements: accumulated on every rank, combined over ranks, written by rank 0.

``EpochMeter`` sums what one rank saw during an epoch; ``MetricsLog`` writes one row per epoch
to ``LOG_DIR/metrics.jsonl`` and TensorBoard, and prints one readable line (:func:`format_row`:
the time per iteration, split into parts that add up).
"""

import json
import time
from pathlib import Path

from trainer.distributed import sum_over_ranks


class EpochMeter:
    """Sums of one rank's training epoch: loss, samples, phase times and bytes sent."""

    _FIELDS = (
        "loss_sum",
        "samples",
        "compute_seconds",
        "sync_seconds",
        "exposed_sync_seconds",
        "comm_seconds",
        "select_seconds",
        "bytes_sent",
        "host_syncs",
    )

    def __init__(self):
        self.sums = dict.fromkeys(self._FIELDS, 0.0)
        self.iterations = 0
        self.started = time.perf_counter()

    def add_step(self, loss, samples, compute_seconds, sync_seconds, sync_stats, exposed=None):
        """Record one iteration; ``sync_stats`` is the synchronizer's ``stats`` of that step.

        ``sync_seconds`` is the synchronization's whole time, ``exposed`` the part of it after
        compute ended (the whole time when ``None``: a blocking synchronization).
        """
        self.iterations += 1
        self.sums["exposed_sync_seconds"] += sync_seconds if exposed is None else exposed
        self.sums["loss_sum"] += loss * samples
        self.sums["samples"] += samples
        self.sums["compute_seconds"] += compute_seconds
        self.sums["sync_seconds"] += sync_seconds
        self.sums["comm_seconds"] += sync_stats["seconds"]["comm"]
        self.sums["select_seconds"] += sync_stats["seconds"]["select"]
        self.sums["bytes_sent"] += sync_stats["bytes_sent"]
        self.sums["host_syncs"] += sync_stats.get("host_syncs", 0)

    def summary(self, comm):
        """Combine all ranks (collective): mean loss per sample; times and bytes per rank."""
        totals = dict(zip(self._FIELDS, sum_over_ranks(comm, [self.sums[f] for f in self._FIELDS])))
        workers = comm.Get_size()
        return {
            "epoch_iters": self.iterations,
            "train_loss": totals["loss_sum"] / max(totals["samples"], 1.0),
            "epoch_seconds": time.perf_counter() - self.started,
            "compute_seconds": totals["compute_seconds"] / workers,
            "sync_seconds": totals["sync_seconds"] / workers,
            "exposed_sync_seconds": totals["exposed_sync_seconds"] / workers,
            "comm_seconds": totals["comm_seconds"] / workers,
            "select_seconds": totals["select_seconds"] / workers,
            "bytes_sent_per_rank": totals["bytes_sent"] / workers,
            # the transport's waits for a GPU (staging for an MPI that is not CUDA-aware)
            "host_syncs_per_rank": totals["host_syncs"] / workers,
        }


class MetricsLog:
    """Rank 0 writes each epoch's row to ``metrics.jsonl`` and TensorBoard and prints a line.

    Other ranks, and rank 0 without a ``log_dir``, only print (rank 0) or do nothing. Rows are
    appended, so a resumed run continues the same file; :meth:`start` first drops the rows this
    run replaces.
    """

    def __init__(self, log_dir, rank):
        self.active = rank == 0
        self.writer = None
        self.path = None
        if self.active and log_dir is not None:  # created when the run starts logging
            self.path = Path(log_dir) / "metrics.jsonl"

    def start(self, after_epoch):
        """Begin this run's rows: keep only those of epochs up to ``after_epoch`` (the checkpoint a
        resumed run continues from; 0 for a fresh run, which starts an empty file).

        A file that loses rows is first copied whole to the first free ``metrics.jsonl.N``, so a
        re-run (or a ``--resume`` from a mistyped checkpoint directory) never destroys a record.
        TensorBoard likewise hides the later epochs that earlier event files in the directory hold
        (the new event file starts by purging them), so their curves do not mix with this run's.
        """
        if self.path is None:
            return
        self._open_writer(purge_step=after_epoch + 1)
        if not self.path.is_file():
            return
        text = self.path.read_text()
        lines = text.splitlines()
        kept = [
            line for line in lines if _epoch_of(line) is not None and _epoch_of(line) <= after_epoch
        ]
        if len(kept) == len(lines):
            return
        backup = _first_free_copy(self.path)
        backup.write_text(text)
        self.path.write_text("".join(line + "\n" for line in kept))
        self.note(f"kept the earlier rows of {self.path} in {backup.name}")

    def note(self, message):
        """Print a message once (rank 0)."""
        if self.active:
            print(message, flush=True)

    def log(self, row):
        """Record one epoch's ``row`` (a dict of JSON-serialisable values, with ``epoch``).

        A row of an evaluation within an epoch (``within_epoch``, ``--eval-every``) goes to
        ``metrics.jsonl`` and the screen, not to TensorBoard, whose curves are per epoch.
        """
        if not self.active:
            return
        print(format_row(row), flush=True)
        if self.path is not None:
            if self.writer is None:
                self._open_writer()
            with open(self.path, "a") as stream:
                stream.write(json.dumps(row) + "\n")
            if row.get("within_epoch"):  # TensorBoard's curves are per epoch: its rows only
                return
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "epoch":
                    self.writer.add_scalar(key, value, row["epoch"])
            self.writer.flush()

    def close(self):
        """Close the TensorBoard writer."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _open_writer(self, purge_step=None):
        """A new TensorBoard event file in the log directory; ``purge_step``: TensorBoard hides
        the events of that epoch and later from the directory's earlier files."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Imported here: only rank 0 pays tensorboardX's import time.
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(self.path.parent), purge_step=purge_step)


def _first_free_copy(path):
    """``path.1``, or ``path.2`` if that exists, and so on."""
    number = 1
    while path.with_name(f"{path.name}.{number}").exists():
        number += 1
    return path.with_name(f"{path.name}.{number}")


def _epoch_of(line):
    """The epoch of a ``metrics.jsonl`` line, or None for a line that is not an epoch row."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row.get("epoch") if isinstance(row, dict) else None


def time_split(row) -> dict:
    """A row's times split into named parts that add up, per iteration (per epoch in a row
    without ``epoch_iters``, as older trainers wrote), as ``scripts/report.py`` splits them.

    ``unit`` (``"iteration"`` or ``"epoch"``); ``total`` (``epoch_seconds``: rank 0's wall time
    of the row's iterations) = ``compute`` + ``exposed`` (the synchronization left after compute
    ended: all of it without overlap) + ``other`` (loading batches, the optimizer step, the
    ranks' agreement on stopping); ``sync`` (the synchronization's whole time, overlapped or
    not) = ``select`` + ``comm`` + ``sync_other`` (flattening, packing, accumulation, writing
    back); ``bytes`` sent per rank. The times other than ``total`` are means over the ranks.
    """
    iterations = row.get("epoch_iters") or 0
    per = max(iterations, 1)
    total = row["epoch_seconds"] / per
    compute = row["compute_seconds"] / per
    sync = row["sync_seconds"] / per
    exposed = row.get("exposed_sync_seconds", row["sync_seconds"]) / per
    select = row["select_seconds"] / per
    comm = row["comm_seconds"] / per
    return {
        "unit": "iteration" if iterations else "epoch",
        "iterations": iterations,
        "total": total,
        "compute": compute,
        "exposed": exposed,
        "other": total - compute - exposed,
        "sync": sync,
        "select": select,
        "comm": comm,
        "sync_other": sync - select - comm,
        "bytes": row["bytes_sent_per_rank"] / per,
    }


def format_row(row):
    """One human-readable line for an epoch row: losses, accuracy, learning rate, and the row's
    time per iteration split into parts that add up (:func:`time_split`), in one fixed form
    whether or not the synchronization overlapped compute."""
    where = f" (iteration {row['iters']})" if row.get("within_epoch") else ""
    t = time_split(row)
    count = (
        f"{format_seconds(row['epoch_seconds'])} for {t['iterations']} "
        f"{'iteration' if t['iterations'] == 1 else 'iterations'}; "
        if t["iterations"]
        else ""
    )
    return (
        f"epoch {row['epoch']:>3}/{row['max_epochs']}{where}  train loss {row['train_loss']:.4f}  "
        f"test loss {row['test_loss']:.4f}  test acc {100 * row['test_acc']:.2f}%  "
        f"lr {row['lr']:.4g}  {count}per {t['unit']}: "
        f"{format_seconds(t['total'])} = compute {format_seconds(t['compute'])}"
        f" + exposed sync {format_seconds(t['exposed'])} + other {format_seconds(t['other'])}; "
        f"sync {format_seconds(t['sync'])} = select {format_seconds(t['select'])}"
        f" + comm {format_seconds(t['comm'])} + other {format_seconds(t['sync_other'])}; "
        f"sent {format_bytes(t['bytes'])}/rank"
    )


def format_seconds(seconds) -> str:
    """A duration in seconds with one decimal, or in milliseconds below a second, where one
    decimal of seconds would print a short epoch's phases as "0.0s"."""
    return f"{seconds:.1f}s" if abs(seconds) >= 1 else f"{seconds * 1e3:.1f}ms"


def format_bytes(count) -> str:
    """A byte count in B, KiB, MiB or GiB, whichever keeps the number below 1024 (4 significant
    digits)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(count) < 1024:
            return f"{count:.4g} {unit}"
        count /= 1024
    return f"{count:.4g} GiB"
