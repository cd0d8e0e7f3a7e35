"""The headline tables: every method at P = 4, 6, 8 on one shaped link, from the benchmark's rows.

``scripts/experiments/headline.sh OUT`` writes ``OUT/bench_RATE_pP.json``; the README's table
(:func:`summary_table`) and docs/PERFORMANCE.md's (:func:`detail_table`) are made from them.
"""

from __future__ import annotations

import glob
import json
import os
import re

__all__ = ["RUNS", "NAMES", "load", "summary_table", "detail_table"]

#: The kept rows of the headline runs (the newest folder is the one published).
RUNS = "runs/headline/epyc2-2026-12-07"

#: How the README names the methods (PERFORMANCE.md uses the registry's names).
NAMES = {
    "dense": "dense (all-reduce)",
    "gaussiank": "Gaussiank",
    "gtopk": "gTop-k",
    "oktopk": "Ok-Topk",
    "topk": "TopkA",
    "topkdsa": "TopkDSA",
    "zen": "ZEN",
    "spardl": "**SparDL**",
    "floor": "its own messages alone, no method work",
    "floor+ef": "its own messages + error feedback, no method work",
}
_ORDER = ("dense", "gaussiank", "gtopk", "oktopk", "topk", "topkdsa", "zen", "spardl")
_FLOORS = ("floor", "floor+ef")


def load(root: str, rate: str, folder: str = RUNS) -> dict:
    """``{P: {method: row}}`` of the fp32 rows at ``rate`` (``bench_RATE_pP.json``)."""
    runs = {}
    pattern = os.path.join(root, folder, f"bench_{rate}_p*.json")
    for path in glob.glob(pattern):
        workers = int(re.search(r"_p(\d+)\.json$", path).group(1))
        with open(path) as stream:
            rows = json.load(stream)
        runs[workers] = {row["label"]: row for row in rows if row["wire"] == "fp32"}
    if not runs:
        raise ValueError(f"no benchmark rows {pattern}")
    return dict(sorted(runs.items()))


def _speedups(runs: dict, name: str) -> str:
    ratios = [runs[p][name]["median_ms"] / runs[p]["spardl"]["median_ms"] for p in runs]
    return "1" if name == "spardl" else " / ".join(f"{r:.2f}" for r in ratios)


def _time(runs: dict, p: int, name: str) -> str:
    ms = runs[p][name]["median_ms"]
    fastest = min(runs[p][m]["median_ms"] for m in _ORDER if m in runs[p])
    return f"**{ms:.1f}**" if ms == fastest else f"{ms:.1f}"


def summary_table(root: str, rate: str = "1gbit", folder: str = RUNS) -> str:
    """The README's table: median ms per P, and SparDL's speed-up over each method."""
    runs = load(root, rate, folder)
    ps = list(runs)
    heads = " | ".join(f"P = {p}" for p in ps)
    lines = [
        f"| method | {heads} | SparDL's speed-up at P = {' / '.join(map(str, ps))} |",
        "|---|" + "---:|" * (len(ps) + 1),
    ]
    for name in (*_ORDER, *_FLOORS):
        if all(name in runs[p] for p in ps):
            times = " | ".join(_time(runs, p, name) for p in ps)
            lines.append(f"| {NAMES[name]} | {times} | {_speedups(runs, name)} |")
    return "\n".join(lines) + "\n"


def _split(row: dict) -> str:
    return " / ".join(f"{row[f'{phase}_ms']:.0f}" for phase in ("select", "comm", "accumulate"))


def detail_table(root: str, rate: str = "1gbit", folder: str = RUNS) -> str:
    """Return docs/PERFORMANCE.md's table.

    Per P the median ms; at the smallest and largest P the slowest rank's select / comm /
    accumulate; at the largest P the bytes and rounds.
    """
    runs = load(root, rate, folder)
    ps = list(runs)
    low, high = ps[0], ps[-1]
    heads = []
    for p in ps:
        heads.append(f"P={p} ms")
        if p in (low, high):
            heads.append(f"P={p} select / comm / accum")
    every = " / ".join(map(str, ps))
    heads += [f"P={high} MB/rank", f"P={high} rounds", f"SparDL's speed-up, P = {every}"]
    lines = ["| method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for name in (*_ORDER, *_FLOORS):
        if not all(name in runs[p] for p in ps):
            continue
        cells = []
        for p in ps:
            cells.append(_time(runs, p, name))
            if p in (low, high):
                cells.append(_split(runs[p][name]))
        top = runs[high][name]
        cells += [f"{top['bytes_per_rank'] / 1e6:.3f}", str(top["rounds"]), _speedups(runs, name)]
        shown = f"**{name}**" if name == "spardl" else name
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
