"""The GPU-cluster projection's tables (``syncbench.gpu_projection``'s rows; docs/CHOOSING.md).

A cell is a method's projected milliseconds per synchronization, ``low-high`` where its local
work has two bounds, ``>= x`` where only a lower bound is projected (PowerSGD: communication
only; TopkA: a local work that does not grow with the P k entries it sums). The fastest is the
method with both bounds whose high bound is below every other such method's low bound; where
none is, the methods whose ranges overlap the best high bound are named, with no ranking. A
method bounded from below only is never ranked first: it is named as not ruled out where its
lower bound is under the winner's time.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

__all__ = ["LOWER_BOUNDS", "COLUMNS", "fastest", "projection_tables", "main"]

#: Labels whose rows bound their time from below only.
LOWER_BOUNDS = frozenset({"powersgd", "topk"})
#: (label, column heading), in the tables' order.
COLUMNS = (
    ("dense", "NCCL dense"),
    ("dense(wire=fp16)", "NCCL dense fp16"),
    ("powersgd", "PowerSGD r4"),
    ("topk", "TopkA"),
    ("gtopk", "gTop-k"),
    ("spardl", "SparDL"),
    ("spardl(wire=fp16)", "SparDL fp16"),
)
_NAMES = dict(COLUMNS)


def _high(row: dict) -> float:
    return math.inf if row["label"] in LOWER_BOUNDS else row["high_ms"]


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    low, high = row["low_ms"], _high(row)
    if math.isinf(high):
        return f">= {low:.3g}"
    if high <= low * 1.005:
        return f"{low:.3g}"
    return f"{low:.3g}-{high:.3g}"


def fastest(rows: list) -> str:
    """The fastest of one setting's projected rows and by how much, or those that tie.

    Among the rows with both bounds (docstring); then the rows projected from below only whose
    lower bound is under the winner's time are named as not ruled out.
    """
    bounded = [row for row in rows if not math.isinf(_high(row))]
    best = min(bounded, key=_high)
    bar = min(row["low_ms"] for row in bounded if row is not best)
    if _high(best) < bar:
        verdict = f"**{_NAMES[best['label']]}**, >= {bar / _high(best):.2f}x"
    else:
        tied = [row for row in bounded if row["low_ms"] <= _high(best)]
        verdict = "no ranking: " + ", ".join(_NAMES[row["label"]] for row in tied)
    open_ = [
        _NAMES[row["label"]]
        for row in rows
        if math.isinf(_high(row)) and row["low_ms"] < _high(best)
    ]
    return verdict + (f"; not ruled out: {', '.join(open_)}" if open_ else "")


def projection_tables(rows: list) -> str:
    """One Markdown table per model: a line per link rate and P, a column per method."""
    out = []
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == model]
        numel = mine[0]["numel"]
        out += [
            f"{model}, n = {numel:,}, ms per synchronization (density 0.01 for the sparse rows)",
            "",
            "| link per node | P | " + " | ".join(name for _, name in COLUMNS) + " | fastest |",
            "|---|---:|" + "---:|" * len(COLUMNS) + "---|",
        ]
        settings = dict.fromkeys((row["rate"], row["workers"]) for row in mine)
        for rate, workers in sorted(settings, key=lambda s: (float(s[0][:-4]), s[1])):
            here = {
                row["label"]: row
                for row in mine
                if (row["rate"], row["workers"]) == (rate, workers)
            }
            cells = [_cell(here.get(label)) for label, _ in COLUMNS]
            verdict = fastest(list(here.values()))
            out.append(f"| {rate} | {workers} | " + " | ".join(cells) + f" | {verdict} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> str:
    """``python -m trainreport.projection ROWS.json...``: print the tables of projected rows."""
    parser = argparse.ArgumentParser(prog="python -m trainreport.projection", description=__doc__)
    parser.add_argument("rows", nargs="+", help="JSON rows of python -m syncbench.gpu_projection")
    args = parser.parse_args(argv)
    rows = []
    for path in args.rows:
        try:
            rows += json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            parser.error(f"{path}: {error}")
    text = projection_tables(rows)
    print(text)
    return text


if __name__ == "__main__":
    main()
