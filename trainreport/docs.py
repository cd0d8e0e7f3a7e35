"""Every published table, regenerated from its raw rows under ``runs/`` and checked.

    python -m trainreport.docs check         # exit 0 when every table matches its raw rows
    python -m trainreport.docs show TABLE    # print one table as its raw rows give it
    python -m trainreport.docs list          # the tables, where each is published, its rows

A table is named in :data:`TABLES`: the document that publishes it, a line of that document it
follows (the first table after that line is the published one), and how it is made from the
raw rows. ``check`` compares every published table's rows with the regenerated ones, line by
line, and names the tables and the first line that differ. Paths are relative to the
repository root (``--root``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from typing import Callable, NamedTuple

from trainreport import experiments


class Table(NamedTuple):
    """One published table: where it is, what it follows, and how it is regenerated."""

    document: str
    after: str
    rows: str  # the raw rows' folder or file, for ``list``
    make: Callable[[str], str]  # repository root -> Markdown holding the table


def _section(text: str, heading: str) -> str:
    """The part of ``text`` under the line ``### heading`` (up to the next such line)."""
    parts = re.split(r"^### ", text, flags=re.M)
    for part in parts:
        if part.startswith(heading + "\n"):
            return part
    raise ValueError(f"no section {heading!r} in the regenerated text")


def _quiet(make: Callable[[], str]) -> str:
    """``make()`` without the notes that loading runs prints on stderr."""
    with contextlib.redirect_stderr(io.StringIO()):
        return make()


def _tta(rate: str, folder: str = "", targets=(0.7, 0.75)) -> Callable[[str], str]:
    def make(root: str) -> str:
        runs = os.path.join(root, "runs", "experiments", folder)
        return _section(_quiet(lambda: experiments.tta_table(runs, list(targets))), rate)

    return make


def _experiment(kind: str) -> Callable[[str], str]:
    def make(root: str) -> str:
        folder = os.path.join(root, "runs", "experiments")
        if kind == "residuals":
            return _quiet(lambda: experiments.residuals_table(folder, "1gbit"))
        if kind == "sweep":
            return _quiet(lambda: experiments.sweep_table(folder))
        if kind == "scaling":
            return _quiet(lambda: experiments.scaling_table(folder))
        seeds = os.path.join(folder, "seeds")
        return _section(_quiet(lambda: experiments.seeds_table(seeds, [0.75, 0.8])), kind)

    return make


HOOK_ROW = re.compile(
    r"seed (\d+): (.*?)\s+first\s+\S+\s+last 20 steps\s+(\S+)\s+whole set\s+(\S+)$"
)


def hook_momentum_table(path: str) -> str:
    """Return docs/DDP_HOOK.md's momentum table from ``tests/hook_momentum.py``'s output.

    Per variant, the mean (min-max) over the seeds of the loss over the last 20 steps and on the
    whole set.
    """
    variants: dict = {}
    with open(path) as stream:
        for line in stream:
            match = HOOK_ROW.match(line.strip())
            if match:
                name, last, whole = match.group(2), float(match.group(3)), float(match.group(4))
                variants.setdefault(name, []).append((last, whole))

    def spread(values):
        mean = sum(values) / len(values)
        return f"{mean:.3g} ({min(values):.3g}-{max(values):.3g})"

    lines = [
        "| run | seeds | loss, last 20 steps | loss on the whole set |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, rows in variants.items():
        lines.append(
            f"| {name} | {len(rows)} | {spread([r[0] for r in rows])} | "
            f"{spread([r[1] for r in rows])} |"
        )
    return "\n".join(lines) + "\n"


def _hook(root: str) -> str:
    return hook_momentum_table(os.path.join(root, "runs", "convergence", "hook_momentum.txt"))


#: Every table the documents publish from raw rows under ``runs/``.
TABLES = {
    "tta-1gbit": Table(
        "docs/EXPERIMENTS.md", "### 1 Gbit/s", "runs/experiments/1gbit", _tta("1gbit")
    ),
    "tta-100mbit-80": Table(
        "docs/EXPERIMENTS.md", "### 100 Mbit/s", "runs/experiments/100mbit-80", _tta("100mbit-80")
    ),
    "tta-100mbit": Table(
        "docs/EXPERIMENTS.md",
        "The first 100 Mbit/s run",
        "runs/experiments/100mbit",
        _tta("100mbit"),
    ),
    "tta-seeds": Table(
        "docs/EXPERIMENTS.md",
        "## a2. Time to accuracy over three seeds",
        "runs/experiments/seeds/1gbit",
        _experiment("1gbit"),
    ),
    "tta-seeds-100mbit": Table(
        "docs/EXPERIMENTS.md",
        "### a2 at 100 Mbit/s",
        "runs/experiments/seeds/100mbit",
        _experiment("100mbit"),
    ),
    "residuals": Table(
        "docs/EXPERIMENTS.md",
        "## b. Global against local residuals",
        "runs/experiments/1gbit",
        _experiment("residuals"),
    ),
    "density-sweep": Table(
        "docs/EXPERIMENTS.md", "## c. Density sweep", "runs/experiments/sweep", _experiment("sweep")
    ),
    "zen-scaling": Table(
        "docs/EXPERIMENTS.md",
        "## d. ZEN, SparDL and TopkA",
        "runs/experiments/scaling",
        _experiment("scaling"),
    ),
    "sharding-100mbit": Table(
        "docs/FSDP.md",
        "### 100 Mbit/s",
        "runs/experiments/sharding/100mbit",
        _tta("100mbit", "sharding", (0.7,)),
    ),
    "sharding-1gbit": Table(
        "docs/FSDP.md",
        "### 1 Gbit/s",
        "runs/experiments/sharding/1gbit",
        _tta("1gbit", "sharding", (0.7,)),
    ),
    "hook-momentum": Table(
        "docs/DDP_HOOK.md",
        "## What a hook user must know",
        "runs/convergence/hook_momentum.txt",
        _hook,
    ),
}


def table_lines(text: str) -> list:
    """The lines of the first Markdown table in ``text`` (stripped)."""
    lines, started = [], False
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line.strip())
            started = True
        elif started:
            break
    return lines


def published(root: str, table: Table) -> list:
    """The lines of ``table`` as its document publishes it.

    Raises:
        ValueError: the document or the line the table follows is missing.
    """
    path = os.path.join(root, table.document)
    with open(path) as stream:
        text = stream.read()
    at = text.find(table.after)
    if at < 0:
        raise ValueError(f"{table.document} has no line {table.after!r}")
    return table_lines(text[at:])


def difference(root: str, name: str) -> str | None:
    """Why table ``name`` as published differs from its raw rows, or ``None`` if it does not."""
    table = TABLES[name]
    try:
        mine, theirs = published(root, table), table_lines(table.make(root))
    except (OSError, ValueError) as error:
        return f"{name}: {error}"
    for number, (line, expected) in enumerate(zip(mine, theirs), 1):
        if line != expected:
            return (
                f"{name} ({table.document}), line {number} of the table:\n"
                f"  published: {line}\n  raw rows:  {expected}"
            )
    if len(mine) != len(theirs):
        return (
            f"{name} ({table.document}): {len(mine)} lines published, {len(theirs)} from the rows"
        )
    return None


def main(argv=None) -> int:
    """Run ``check``, ``show TABLE`` or ``list``; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m trainreport.docs", description=__doc__)
    parser.add_argument("action", choices=("check", "show", "list"))
    parser.add_argument("table", nargs="?", help="show: the table's name (see list)")
    parser.add_argument(
        "--root",
        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        help="the repository root (default: this checkout)",
    )
    args = parser.parse_args(argv)
    if args.action == "list":
        for name, table in TABLES.items():
            print(f"{name}: {table.document}, after {table.after!r}; rows in {table.rows}")
        return 0
    if args.action == "show":
        if args.table not in TABLES:
            parser.exit(2, f"docs: unknown table {args.table!r}; valid: {', '.join(TABLES)}\n")
        print("\n".join(table_lines(TABLES[args.table].make(args.root))))
        return 0
    problems = [p for p in (difference(args.root, name) for name in TABLES) if p]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(TABLES) - len(problems)} of {len(TABLES)} tables match their raw rows")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
