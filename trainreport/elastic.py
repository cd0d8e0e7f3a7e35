"""docs/ELASTIC.md's tables from their raw rows under ``runs/elastic/``.

:func:`torchrun_table`: the restarts of ``examples/elastic_ddp.py`` under one torchrun agent,
one line per try (``rc=STATUS ...``, the example's lines); :func:`mpi_table`: the trainer killed
and continued (``scripts/experiments/elastic.sh``).
"""

from __future__ import annotations

import json
import os
import re
import statistics

__all__ = ["torchrun_table", "mpi_table"]

#: The torchrun tries' files, what ran and which rendezvous store the workers used.
TORCHRUN_RUNS = (
    ("hook-own-store.log", "spardl hook", "one per round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)"),
    ("hook-shared-store.log", "spardl hook", "the agent's, shared across rounds (torch's default)"),
    ("ddp-shared-store.log", "plain DDP", "the agent's, shared across rounds (torch's default)"),
)
_AGAIN = re.compile(r"training again ([\d.]+) s after a worker died")


def torchrun_table(root: str) -> str:
    """The restarts' table: per variant, tries and how they ended.

    Finished, failed in Gloo's connectFullMesh, hung (the 180 s limit), and the seconds from the
    death to training again (median, min-max) of the finished ones.
    """
    lines = [
        "| run | workers' store | tries | finished | connectFullMesh refused | hung "
        "| death to training again, s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    folder = os.path.join(root, "runs", "elastic", "torchrun-restarts-epyc2-2026-12-07")
    for name, what, store in TORCHRUN_RUNS:
        with open(os.path.join(folder, name)) as stream:
            tries = [line for line in stream if line.startswith("rc=")]
        finished = [line for line in tries if line.startswith("rc=0 ")]
        refused = sum("connectFullMesh" in line for line in tries)
        hung = sum(line.startswith("rc=124") for line in tries)
        again = [float(m.group(1)) for line in finished for m in [_AGAIN.search(line)] if m]
        spread = (
            f"{statistics.median(again):.1f} ({min(again):.1f}-{max(again):.1f})" if again else "-"
        )
        lines.append(
            f"| {what} | {store} | {len(tries)} | {len(finished)} | {refused} | {hung} | {spread} |"
        )
    return "\n".join(lines) + "\n"


def _last_row(path: str) -> dict:
    with open(path) as stream:
        return json.loads(stream.read().splitlines()[-1])


def mpi_table(root: str) -> str:
    """The killed-and-continued table: per run, where it ended and how long restarts took.

    The ranks it ended on, its iterations, its final test accuracy and the gap to the
    uninterrupted run, and the seconds from each kill to the restarted run's "resumed" line.
    """
    folder = os.path.join(root, "runs", "elastic", "epyc2-2026-12-07")
    straight = _last_row(os.path.join(folder, "straight", "log", "metrics.jsonl"))
    with open(os.path.join(folder, "killed", "restarts.txt")) as stream:
        continued = dict(line.split(" restart_seconds ") for line in stream.read().splitlines())
    with open(os.path.join(folder, "repeated", "restarts.txt")) as stream:
        repeated = [float(re.search(r": ([\d.]+) s", line).group(1)) for line in stream]
    runs = [("uninterrupted, 4 ranks", "straight", "-")]
    runs += [
        (
            f"killed at iteration 200 of 4 ranks, continued on {n}",
            f"killed/on{n}",
            continued[f"on{n}"],
        )
        for n in (3, 2)
    ]
    runs.append(
        (
            f"killed {len(repeated)} times, continued on 4 3 2 3 4 3 ranks",
            "repeated",
            f"{statistics.median(repeated):.1f} ({min(repeated):.1f}-{max(repeated):.1f})",
        )
    )
    lines = [
        "| run | ranks at the end | iterations | test accuracy | vs uninterrupted, points "
        "| kill to resumed, s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, where, seconds in runs:
        row = _last_row(os.path.join(folder, where, "log", "metrics.jsonl"))
        gap = 100 * (row["test_acc"] - straight["test_acc"])
        lines.append(
            f"| {label} | {row['nworkers']} | {row['iters']} | {100 * row['test_acc']:.2f}% | "
            f"{'-' if where == 'straight' else f'{gap:+.2f}'} | {seconds} |"
        )
    return "\n".join(lines) + "\n"
