"""Every published table, regenerated from its raw rows under ``runs/`` and checked.

    python -m trainreport.docs check         # exit 0 when every table matches its raw rows
    python -m trainreport.docs show TABLE    # print one table as its raw rows give it
    python -m trainreport.docs list          # the tables, where each is published, its rows

A table is named in :data:`TABLES`: the document that publishes it, a line of that document it
follows (the first table after that line is the published one), and how it is made from the
raw rows. ``check`` compares every published table's rows with the regenerated ones, line by
line, and names the tables and the first line that differ. Paths are relative to the
repository root (``--root``).

``check`` also compares the figures that prose quotes from these tables, where the claim
names its table with the marker ``(rows: `NAME`)`` (:mod:`trainreport.citations`).

A published table whose raw rows were not kept is not in :data:`TABLES`; its document says so
under it, in a line that begins "Raw rows not kept" (``grep -rn "Raw rows not kept" docs
README.md`` lists them).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from typing import Callable, NamedTuple

from trainreport import citations, elastic, experiments, headline, projection

__all__ = [
    "Table",
    "HOOK_ROW",
    "hook_momentum_table",
    "zen_beside_spardl_table",
    "LEAN",
    "ops_table",
    "ops_fp16_table",
    "ops_lists_fp16_table",
    "SEVENTH",
    "early_post_table",
    "FIFTH",
    "buffer_reuse_table",
    "BENCH_NAMES",
    "fixed_rows_table",
    "bench_p4_table",
    "lean_replay_table",
    "lean_bench_table",
    "HOOK_NAMES",
    "lean_ddp_table",
    "lean_ddp_table_again",
    "GPU",
    "GPU_PROJECTION",
    "gpu_replay_table",
    "gpu_ops_table",
    "gpu_bert_table",
    "zen_bytes_table",
    "TABLES",
    "table_lines",
    "published",
    "difference",
    "main",
]


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


def _epoch(rate: str) -> Callable[[str], str]:
    """The full-epoch time-to-accuracy table of ``rate`` (``runs/experiments/epoch``)."""

    def make(root: str) -> str:
        folder = os.path.join(root, "runs", "experiments", "epoch")
        return _section(_quiet(lambda: experiments.seeds_table(folder, [0.8, 0.85])), rate)

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


def _nth_table(make: Callable[[str], str], index: int) -> Callable[[str], str]:
    """``make``, cut to its ``index``-th Markdown table (0-based) and what follows it."""

    def cut(root: str) -> str:
        lines, tables, inside = make(root).splitlines(), [], False
        for number, line in enumerate(lines):
            is_row = line.strip().startswith("|")
            if is_row and not inside:
                tables.append(number)
            inside = is_row
        return "\n".join(lines[tables[index] :]) + "\n"

    return cut


def _load(root: str, path: str):
    with open(os.path.join(root, path)) as stream:
        return json.load(stream)


def _bold_fastest(rows: list) -> list:
    """Cells of ``rows`` (name, [ms, ...]): each column's least time in bold.

    The name is in bold too where every time of its row is.
    """
    least = [min(column) for column in zip(*[times for _, times in rows])]
    out = []
    for name, times in rows:
        cells = [f"**{t:.1f}**" if t == low else f"{t:.1f}" for t, low in zip(times, least)]
        everywhere = all(t == low for t, low in zip(times, least))
        out.append([f"**{name}**" if everywhere else name] + cells)
    return out


def zen_beside_spardl_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's "ZEN beside SparDL at 1 Gbit/s" table.

    Experiment d's benchmark rows (``runs/experiments/scaling/bench_pP.json``), median ms per P.
    """
    folder = os.path.join("runs", "experiments", "scaling")
    workers = (4, 6, 8)
    medians: dict = {}
    for p in workers:
        for row in _load(root, os.path.join(folder, f"bench_p{p}.json")):
            medians.setdefault(row["label"], {})[p] = row["median_ms"]
    rows = [(name, [medians[name][p] for p in workers]) for name in ("zen", "topk", "spardl")]
    lines = ["| method | P=4 ms | P=6 ms | P=8 ms |", "|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _bold_fastest(rows)]
    return "\n".join(lines) + "\n"


LEAN = os.path.join("runs", "lean-engine")


def ops_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's "Operations per call" table.

    Operations / data-dependent ones per P, before the batched steps, after them, with the
    NumPy path and with one split per tensor (``runs/lean-engine/ops_before.json``,
    ``ops_after.json``, ``ops_numpy.json``, ``ops_split.json``), and ops(32) / ops(4).
    """
    whens = ("before", "after", "numpy", "split")
    counts: dict = {}
    for when in whens:
        for row in _load(root, os.path.join(LEAN, f"ops_{when}.json")):
            method = counts.setdefault(row["method"], {w: {} for w in whens})
            method[when][row["workers"]] = (row["ops"], row["data_dependent_ops"])
    workers = sorted(next(iter(counts.values()))["after"])
    header = " | ".join(["P = " + str(workers[0])] + [str(p) for p in workers[1:]])
    lines = [
        f"| method | | {header} | ops({workers[-1]}) / ops(4) |",
        "|" + "---|" * (len(workers) + 3),
    ]

    def row(first: str, per: dict) -> str:
        cells = [f"{per[p][0]}/{per[p][1]}" for p in workers]
        return first + " | ".join(cells) + f" | {per[workers[-1]][0] / per[4][0]:.1f} |"

    names = {"topk": "topk (TopkA)"}
    labels = {"before": "before", "after": "batched", "numpy": "NumPy path", "split": "split"}
    for method, per in counts.items():
        first = f"| {names.get(method, method)} | "
        for when in whens:
            if when != "before" and per[when] == per[_previous(whens, when)]:
                continue  # unchanged by that step
            lines.append(row(first + f"{labels[when]} | ", per[when]))
            first = "| | "
    return "\n".join(lines) + "\n"


def ops_fp16_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of SparDL's operations per call at the fp16 wire.

    Before (per-list compact messages) and after (fixed-size rows), from
    ``runs/lean-engine/ops_fp16_before.json`` and ``ops_fp16_after.json``.
    """
    labels = {"before": "per-list messages (before)", "after": "fixed-size rows (after)"}
    rows = {when: _load(root, os.path.join(LEAN, f"ops_fp16_{when}.json")) for when in labels}
    workers = [row["workers"] for row in rows["after"]]
    header = " | ".join(["P = " + str(workers[0])] + [str(p) for p in workers[1:]])
    lines = [f"| spardl, fp16 wire | {header} |", "|" + "---|" * (len(workers) + 1)]
    for when, label in labels.items():
        cells = [f"{row['ops']}/{row['data_dependent_ops']}" for row in rows[when]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ops_lists_fp16_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of the baselines' operations per call at fp16.

    ZEN, Ok-Topk, TopkDSA and Gaussian-k before (per-list exponents and runs read from the
    device) and after (lists coded on the device), from
    ``runs/lean-engine/ops_lists_fp16_{before,after}.json``, and ops(32) / ops(4).
    """
    labels = {"before": "before", "after": "after"}
    rows = {when: _load(root, os.path.join(LEAN, f"ops_lists_fp16_{when}.json")) for when in labels}
    methods = ("zen", "oktopk", "topkdsa", "gaussiank")
    workers = sorted({row["workers"] for row in rows["after"]})
    header = " | ".join(["P = " + str(workers[0])] + [str(p) for p in workers[1:]])
    lines = [
        f"| method, fp16 wire | | {header} | ops({workers[-1]}) / ops(4) |",
        "|" + "---|" * (len(workers) + 3),
    ]
    for name in methods:
        for when, label in labels.items():
            per = {row["workers"]: row for row in rows[when] if row["method"] == name}
            cells = [f"{per[p]['ops']}/{per[p]['data_dependent_ops']}" for p in workers]
            ratio = per[workers[-1]]["ops"] / per[4]["ops"]
            first = name if when == "before" else ""
            lines.append(f"| {first} | {label} | " + " | ".join(cells) + f" | {ratio:.1f} |")
    return "\n".join(lines) + "\n"


def _previous(sequence: tuple, item):
    """The element of ``sequence`` before ``item``."""
    return sequence[sequence.index(item) - 1]


SEVENTH = os.path.join(LEAN, "2026-11-28-seventh")


def _spardl_medians(root: str, path: str) -> dict:
    """SparDL's median ms per wire in one bench rows file."""
    return {r["wire"]: r["median_ms"] for r in _load(root, path) if r["method"] == "spardl"}


def early_post_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of receives posted before the work meanwhile.

    Six pairs of SparDL runs, before and after (``early_post/{before,after}_N.json``): median ms
    at fp32 and fp16, and fp16's ratio to fp32 computed from the unrounded medians.
    """
    lines = [
        "| pair | fp32 before | fp32 after | fp16 before | fp16 after "
        "| fp16 / fp32 before | after |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in range(1, 7):
        ms = {}
        for when in ("before", "after"):
            path = os.path.join(SEVENTH, "early_post", f"{when}_{pair}.json")
            ms.update({(when, w): t for w, t in _spardl_medians(root, path).items()})
        times = [ms[(w, wire)] for wire in ("fp32", "fp16") for w in ("before", "after")]
        ratios = [ms[(w, "fp16")] / ms[(w, "fp32")] for w in ("before", "after")]
        cells = [f"{t:.1f}" for t in times] + [f"{r:.3f}" for r in ratios]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


FIFTH = os.path.join(LEAN, "2026-11-28-fifth")

#: The fifth round's table: (label, file suffix) per row; columns before, this tree, no reuse.
_FIFTH_ROWS = [
    *((f"20 calls, {n} pair", str(i)) for i, n in enumerate(("1st", "2nd", "3rd", "4th"), 1)),
    *((f"20 calls, {n} pair", f"pair_{i}") for i, n in ((1, "5th"), (2, "6th"))),
    *((f"30 calls, {n} triple", f"30calls_{i}") for i, n in enumerate(("1st", "2nd", "3rd"), 1)),
]


def buffer_reuse_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of the fifth round (message buffers reused).

    SparDL's median ms, fp32 / fp16, per run of ``runs/lean-engine/2026-11-28-fifth/``: the
    tree before (409e37b), this tree (4cd171d) and this tree with the buffers not reused; an
    empty cell where that tree did not run.
    """
    trees = ("409e37b", "4cd171d", "4cd171d-noreuse")
    lines = [
        "| run | 409e37b (before) | this tree | this tree, buffers not reused |",
        "|---|---|---|---|",
    ]
    for label, suffix in _FIFTH_ROWS:
        cells = []
        for tree in trees:
            path = os.path.join(FIFTH, f"bench_1gbit_spardl_{tree}_{suffix}.json")
            if not os.path.exists(os.path.join(root, path)):
                cells.append("")
                continue
            ms = _spardl_medians(root, path)
            cells.append(f"{ms['fp32']:.1f} / {ms['fp16']:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


BENCH_NAMES = {"spardl": "SparDL", "gtopk": "gTop-k", "topk": "TopkA", "oktopk": "Ok-Topk"}


def fixed_rows_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table "with fixed-size rows at the fp16 wire" (2026-11-27)."""
    return bench_p4_table(root, "bench_1gbit_p4_rows.json")


def bench_p4_table(root: str, name: str) -> str:
    """A table of the shaped 1 Gbit/s bench at P = 4, ``runs/lean-engine/NAME``.

    Median ms at fp32 / fp16 per method, the floor rows left out, by the fp32 time, the least in
    bold; SparDL's row adds its operations per call and its data-dependent reads.
    """
    cells: dict = {}
    for row in _load(root, os.path.join(LEAN, name)):
        if not row["method"].startswith("floor"):
            cells.setdefault(row["method"], {})[row["wire"]] = row
    least = min(row["median_ms"] for wires in cells.values() for row in wires.values())
    lines = ["| method | fp32 / fp16 ms |", "|---|---|"]
    for method, wires in sorted(cells.items(), key=lambda item: item[1]["fp32"]["median_ms"]):
        shown = [
            f"**{w['median_ms']:.1f}**" if w["median_ms"] == least else f"{w['median_ms']:.1f}"
            for w in (wires["fp32"], wires["fp16"])
        ]
        cell = " / ".join(shown)
        if method == "spardl":
            reads = wires["fp32"]["data_dependent_ops"] + wires["fp16"]["data_dependent_ops"]
            cell += f" (ops per call {wires['fp32']['ops']} / {wires['fp16']['ops']}, " + (
                "no reads at either wire)" if reads == 0 else f"{reads} reads)"
            )
        lines.append(f"| {BENCH_NAMES.get(method, method.upper())} | {cell} |")
    return "\n".join(lines) + "\n"


def _bench_p4(name: str) -> Callable[[str], str]:
    return lambda root: bench_p4_table(root, name)


def lean_replay_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of one rank's work replayed, before / after.

    The lean engine's replay rows at P = 4 and 16 (``runs/lean-engine/replay_pP_WHEN.json``),
    median ms; the floor rows left out.
    """
    workers = (4, 16)
    medians: dict = {}
    for p in workers:
        for when in ("before", "after"):
            for row in _load(root, os.path.join(LEAN, f"replay_p{p}_{when}.json")):
                if not row["method"].startswith("floor"):
                    medians.setdefault(row["label"], {})[(p, when)] = row["median_ms"]
    lines = [
        "| method | " + " | ".join(f"P = {p}, before / after ms" for p in workers) + " |",
        "|---|" + "---:|" * len(workers),
    ]
    for name, times in medians.items():
        cells = [f"{times[(p, 'before')]:.2f} / {times[(p, 'after')]:.2f}" for p in workers]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def lean_bench_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's lean-engine table at 1 Gbit/s, P = 4.

    Median ms before and after at fp32 and fp16, and the ops per call after
    (``runs/lean-engine/bench_1gbit_p4_*.json``); rows by their time after at fp32, the floor
    rows left out.
    """
    cells: dict = {}
    for when in ("before", "after"):
        for row in _load(root, os.path.join(LEAN, f"bench_1gbit_p4_{when}.json")):
            if not row["method"].startswith("floor"):
                cells.setdefault(row["method"], {})[(when, row["wire"])] = row
    order = ("before", "fp32"), ("after", "fp32"), ("before", "fp16"), ("after", "fp16")
    rows = sorted(
        ((name, [c[key]["median_ms"] for key in order]) for name, c in cells.items()),
        key=lambda row: row[1][1],
    )
    lines = [
        "| method | before fp32 | after fp32 | before fp16 | after fp16 | "
        "ops per call after (fp32 / fp16) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for (name, _), shown in zip(rows, _bold_fastest(rows)):
        ops = f"{cells[name][('after', 'fp32')]['ops']} / {cells[name][('after', 'fp16')]['ops']}"
        lines.append("| " + " | ".join(shown + [ops]) + " |")
    return "\n".join(lines) + "\n"


HOOK_NAMES = {
    "compute": "compute alone",
    "ddp": "DDP default",
    "ddp_fp16": "DDP fp16 hook",
    "powersgd": "PowerSGD rank 4",
    "topk": "topk hook",
    "spardl": "spardl hook",
    "spardl:wire=fp16": "spardl hook, `wire=fp16`",
}


def lean_ddp_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's lean-engine table of the DDP hooks (2026-11-27).

    ``scripts/ddp_compare.py``'s JSON in ``runs/lean-engine/ddp_*.json``: median s/iter (ratio to
    compute alone), the fastest hook of each run in bold.
    """
    runs = [
        ("1 Gbit/s", "ddp_1gbit_after.json"),
        ("1 Gbit/s, 2nd run", "ddp_1gbit_after_b.json"),
        ("1 Gbit/s, before", "ddp_1gbit_before.json"),
        ("100 Mbit/s", "ddp_100mbit_after.json"),
    ]
    return _ddp_table(root, runs)


def lean_ddp_table_again(root: str) -> str:
    """Return the DDP hooks' table of 2026-11-28 (``runs/lean-engine/ddp-2026-11-28/``)."""
    runs = [
        ("1 Gbit/s", "ddp-2026-11-28/ddp_1gbit_a.json"),
        ("1 Gbit/s, 16 iterations", "ddp-2026-11-28/ddp_1gbit_b.json"),
        ("100 Mbit/s", "ddp-2026-11-28/ddp_100mbit.json"),
    ]
    return _ddp_table(root, runs)


def _ddp_table(root: str, runs: list) -> str:
    """The hooks' median s/iter (ratio to compute alone) per ``(title, file)`` of ``runs``."""
    columns = [{r["hook"]: r for r in _load(root, os.path.join(LEAN, f))["rows"]} for _, f in runs]
    hooks = list(dict.fromkeys(h for column in columns for h in column))
    hooks.sort(key=list(HOOK_NAMES).index)
    fastest = [
        min((r for h, r in c.items() if h != "compute"), key=lambda r: r["median_s"])
        for c in columns
    ]
    lines = [
        "| hook | " + " | ".join(title for title, _ in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    for hook in hooks:
        line = f"| {HOOK_NAMES[hook]} "
        for column, best in zip(columns, fastest):
            row = column.get(hook)
            if row is None:
                line += "| "
                continue
            cell = f"{row['median_s']:.3f} ({row['ratio']:.2f})"
            line += f"| **{cell}** " if row is best else f"| {cell} "
        lines.append(line + "|")
    return "\n".join(lines) + "\n"


#: Every table the documents publish from raw rows under ``runs/``.
GPU = os.path.join(LEAN, "gpu-h200-2026-11-27")


def gpu_replay_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of one rank's local work replayed on the GPU.

    ``runs/lean-engine/gpu-h200-2026-11-27/replay_cuda.json`` (``--replay 4 --device cuda
    --count-ops``): median ms and operations / data-dependent ones. Its ``host_sync_ops`` are
    left out: counted before ``syncbench.opcount`` kept to rank 0's thread (the README there).
    """
    lines = [
        "| method | median ms | min-max ms | ops / reads per call |",
        "|---|---:|---:|---:|",
    ]
    for row in _load(root, os.path.join(GPU, "replay_cuda.json")):
        counted = row.get("ops") is not None
        ops = f"{row['ops']}/{row['data_dependent_ops']}" if counted else "-"
        lines.append(
            f"| {row['label']} | {row['median_ms']:.2f} | {row['min_ms']:.2f}-{row['max_ms']:.2f}"
            f" | {ops} |"
        )
    return "\n".join(lines) + "\n"


def gpu_ops_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's operations / host synchronizations per call on the GPU.

    ``runs/lean-engine/gpu-h200-2026-11-27/ops_cuda.json`` (``python -m syncbench.opcount
    --device cuda``): per method, ``ops/data-dependent/host syncs`` at each P.
    """
    rows = _load(root, os.path.join(GPU, "ops_cuda.json"))
    workers = sorted({row["workers"] for row in rows})
    per: dict = {}
    for row in rows:
        cell = f"{row['ops']}/{row['data_dependent_ops']}/{row['host_sync_ops']}"
        per.setdefault(row["method"], {})[row["workers"]] = cell
    lines = [
        "| method | " + " | ".join(f"P = {p}" for p in workers) + " |",
        "|---|" + "---:|" * len(workers),
    ]
    for method, cells in per.items():
        lines.append(f"| {method} | " + " | ".join(cells[p] for p in workers) + " |")
    return "\n".join(lines) + "\n"


def gpu_bert_table(root: str) -> str:
    """Return docs/PERFORMANCE.md's table of bert-base overlapped and blocking on the GPU.

    The trainer's epoch rows ``runs/lean-engine/gpu-h200-2026-11-27/runN_bert_MODE.jsonl``, per
    iteration.
    """
    modes = [
        ("run1_bert_overlap_25", "overlapped, 25 MiB buckets (the default), run 1"),
        ("run2_bert_overlap_25", "overlapped, 25 MiB buckets, run 2"),
        ("run2_bert_overlap_100", "overlapped, 100 MiB buckets"),
        ("run2_bert_overlap_400", "overlapped, 400 MiB (one bucket)"),
        ("run1_bert_blocking", "`--no-overlap`, run 1"),
        ("run2_bert_blocking", "`--no-overlap`, run 2"),
    ]
    lines = [
        "| mode | ms/iter | compute | sync | exposed | select | comm | transport's host syncs"
        " per iter. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in modes:
        with open(os.path.join(root, GPU, name + ".jsonl")) as stream:
            row = json.loads(stream.read().splitlines()[-1])
        per = 1e3 / row["epoch_iters"]
        parts = ("epoch", "compute", "sync", "exposed_sync", "select", "comm")
        times = [row[part + "_seconds"] * per for part in parts]
        cells = " | ".join(f"{value:.1f}" for value in times)
        syncs = row["host_syncs_per_rank"] / row["epoch_iters"]
        lines.append(f"| {label} | {cells} | {syncs:.0f} |")
    return "\n".join(lines) + "\n"


def zen_bytes_table(root: str) -> str:
    """Return docs/DEVIATIONS.md's table of ZEN's bytes (``runs/deviations/zen_bytes.json``)."""
    rows = _load(root, os.path.join("runs", "deviations", "zen_bytes.json"))
    cells = {(row["workers"], row["method"]): row for row in rows}
    lines = ["| P | `zen` | `topk` | `spardl` |", "|---|---|---|---|"]
    for workers in sorted({row["workers"] for row in rows}):
        zen = cells[(workers, "zen")]
        line = [
            f"{zen['bytes_per_rank_calls_2_3']:,.0f} ({zen['rounds']} rounds, {zen['bitmaps']} of "
            f"{workers} partitions as bitmaps, U = {zen['union']:,})"
        ]
        line += [
            f"{cells[(workers, m)]['bytes_per_rank_calls_2_3']:,.0f} "
            f"({cells[(workers, m)]['rounds']} rounds)"
            for m in ("topk", "spardl")
        ]
        lines.append(f"| {workers} | " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


#: Experiment e's rows (scripts/experiments/local_sgd.sh).
LOCAL_SGD = "runs/local-sgd/epyc2-2026-12-07"
#: Experiment e's rows of the outer step overlapped (--outer-overlap) or damped.
LOCAL_SGD_OUTER = "runs/local-sgd/epyc2-2026-12-07-overlap"


#: The GPU-cluster projection's rows (scripts/experiments/gpu_projection.sh).
GPU_PROJECTION = "runs/gpu-projection/epyc2-2026-12-08/projection.json"


def _projection(root: str) -> str:
    """The projection's tables (:func:`trainreport.projection.projection_tables`)."""
    return projection.projection_tables(_load(root, GPU_PROJECTION))


def _local_sgd(rate: str, where: str = LOCAL_SGD) -> Callable[[str], str]:
    """Experiment e's table of ``rate`` (local SGD and DiLoCo against per-step rows)."""

    def make(root: str) -> str:
        folder = os.path.join(root, where)
        return _section(_quiet(lambda: experiments.seeds_table(folder, [0.8, 0.85])), rate)

    return make


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
    "tta-epoch": Table(
        "docs/EXPERIMENTS.md",
        "### a3 at 1 Gbit/s",
        "runs/experiments/epoch/1gbit",
        _epoch("1gbit"),
    ),
    "tta-epoch-100mbit": Table(
        "docs/EXPERIMENTS.md",
        "### a3 at 100 Mbit/s",
        "runs/experiments/epoch/100mbit",
        _epoch("100mbit"),
    ),
    "tta-epoch-dense": Table(
        "docs/EXPERIMENTS.md",
        "### a3, dense DDP for accuracy",
        "runs/experiments/epoch/unshaped",
        _epoch("unshaped"),
    ),
    "sharding-mc-1gbit": Table(
        "docs/FSDP.md",
        "### With momentum correction, 160 iterations, 1 Gbit/s",
        "runs/experiments/sharding-mc/1gbit",
        _tta("1gbit", "sharding-mc", (0.8,)),
    ),
    "sharding-mc-100mbit": Table(
        "docs/FSDP.md",
        "### With momentum correction and the unsharded reference, 100 Mbit/s",
        "runs/experiments/sharding-mc/100mbit",
        _tta("100mbit", "sharding-mc", (0.7,)),
    ),
    "local-sgd-100mbit": Table(
        "docs/EXPERIMENTS.md", "### e at 100 Mbit/s", f"{LOCAL_SGD}/100mbit", _local_sgd("100mbit")
    ),
    "local-sgd-10mbit": Table(
        "docs/EXPERIMENTS.md", "### e at 10 Mbit/s", f"{LOCAL_SGD}/10mbit", _local_sgd("10mbit")
    ),
    "local-sgd-outer": Table(
        "docs/EXPERIMENTS.md",
        "### e, the outer step overlapped or damped, at 100 Mbit/s",
        f"{LOCAL_SGD_OUTER}/100mbit",
        _local_sgd("100mbit", LOCAL_SGD_OUTER),
    ),
    "local-sgd-outer-10mbit": Table(
        "docs/EXPERIMENTS.md",
        "### e, the outer step damped, at 10 Mbit/s",
        f"{LOCAL_SGD_OUTER}/10mbit",
        _local_sgd("10mbit", LOCAL_SGD_OUTER),
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
    "residuals-curve": Table(
        "docs/EXPERIMENTS.md",
        "| iteration | spardl test acc |",
        "runs/experiments/1gbit",
        _nth_table(_experiment("residuals"), 1),
    ),
    "zen-beside-spardl": Table(
        "docs/PERFORMANCE.md",
        "**ZEN beside SparDL at 1 Gbit/s**",
        "runs/experiments/scaling",
        zen_beside_spardl_table,
    ),
    "ops-per-call": Table(
        "docs/PERFORMANCE.md",
        "## Operations per call",
        "runs/lean-engine/ops_{before,after,numpy,split}.json",
        ops_table,
    ),
    "ops-fp16": Table(
        "docs/PERFORMANCE.md",
        "**SparDL at the fp16 wire**",
        "runs/lean-engine/ops_fp16_*.json",
        ops_fp16_table,
    ),
    "ops-lists-fp16": Table(
        "docs/PERFORMANCE.md",
        "**The baselines' lists at the fp16 wire**",
        "runs/lean-engine/ops_lists_fp16_{before,after}.json",
        ops_lists_fp16_table,
    ),
    "gpu-replay": Table(
        "docs/PERFORMANCE.md",
        "**Local work on the H200.**",
        "runs/lean-engine/gpu-h200-2026-11-27/replay_cuda.json",
        gpu_replay_table,
    ),
    "gpu-ops": Table(
        "docs/PERFORMANCE.md",
        "**Operations and host synchronizations per call on the GPU.**",
        "runs/lean-engine/gpu-h200-2026-11-27/ops_cuda.json",
        gpu_ops_table,
    ),
    "gpu-bert": Table(
        "docs/PERFORMANCE.md",
        "**bert-base on the H200, overlapped against blocking.**",
        "runs/lean-engine/gpu-h200-2026-11-27/run*_bert_*.jsonl",
        gpu_bert_table,
    ),
    "early-post": Table(
        "docs/PERFORMANCE.md",
        "six pairs with the trees alternated (`early_post/`)",
        os.path.join(SEVENTH, "early_post"),
        early_post_table,
    ),
    "buffer-reuse": Table(
        "docs/PERFORMANCE.md",
        "the command of the first table in this section otherwise), each tree's scripts run with",
        FIFTH,
        buffer_reuse_table,
    ),
    "fixed-rows-1gbit": Table(
        "docs/PERFORMANCE.md",
        "**With fixed-size rows at the fp16 wire.**",
        os.path.join(LEAN, "bench_1gbit_p4_rows.json"),
        fixed_rows_table,
    ),
    "numpy-path-1gbit": Table(
        "docs/PERFORMANCE.md",
        "**With the NumPy path**",
        os.path.join(LEAN, "bench_1gbit_p4_numpy.json"),
        _bench_p4("bench_1gbit_p4_numpy.json"),
    ),
    "split-1gbit": Table(
        "docs/PERFORMANCE.md",
        "**Once more on 2026-11-28**",
        os.path.join(LEAN, "bench_1gbit_p4_split.json"),
        _bench_p4("bench_1gbit_p4_split.json"),
    ),
    "requantize-1gbit": Table(
        "docs/PERFORMANCE.md",
        "- **All methods, the command above** (8 calls), median ms:",
        os.path.join(LEAN, "bench_1gbit_p4_requantize.json"),
        _bench_p4("bench_1gbit_p4_requantize.json"),
    ),
    "lean-replay": Table(
        "docs/PERFORMANCE.md",
        "One rank's local work alone, replayed",
        "runs/lean-engine/replay_p*.json",
        lean_replay_table,
    ),
    "lean-bench-1gbit": Table(
        "docs/PERFORMANCE.md",
        "**1 Gbit/s, P = 4, n = 14,728,266, density 0.01**",
        "runs/lean-engine/bench_1gbit_p4_*.json",
        lean_bench_table,
    ),
    "headline-1gbit": Table(
        "README.md",
        "The paper's setting, a network that is slow against the machine",
        headline.RUNS,
        lambda root: headline.summary_table(root, "1gbit"),
    ),
    "headline-1gbit-detail": Table(
        "docs/PERFORMANCE.md",
        "**1 Gbit/s, 2026-12-07**",
        headline.RUNS,
        lambda root: headline.detail_table(root, "1gbit"),
    ),
    "headline-10gbit-detail": Table(
        "docs/PERFORMANCE.md",
        "**10 Gbit/s, 2026-12-07**",
        headline.RUNS,
        lambda root: headline.detail_table(root, "10gbit"),
    ),
    "elastic-torchrun": Table(
        "docs/ELASTIC.md",
        "**torchrun restarts**",
        "runs/elastic/torchrun-restarts-epyc2-2026-12-07",
        elastic.torchrun_table,
    ),
    "elastic-mpi": Table(
        "docs/ELASTIC.md",
        "**Killed and continued**",
        "runs/elastic/epyc2-2026-12-07",
        elastic.mpi_table,
    ),
    "zen-bytes": Table(
        "docs/DEVIATIONS.md",
        "Bytes per rank and call, measured on `local_group`",
        "runs/deviations/zen_bytes.json",
        zen_bytes_table,
    ),
    "lean-ddp-hooks": Table(
        "docs/PERFORMANCE.md",
        "**DDP hooks, VGG-16, 4 ranks, batch 16, torchrun with Gloo**",
        "runs/lean-engine/ddp_*.json",
        lean_ddp_table,
    ),
    "gpu-projection-vgg16": Table(
        "docs/CHOOSING.md",
        "**VGG-16's gradient**",
        GPU_PROJECTION,
        _nth_table(_projection, 0),
    ),
    "gpu-projection-bert-large": Table(
        "docs/CHOOSING.md",
        "**BERT-large's gradient**",
        GPU_PROJECTION,
        _nth_table(_projection, 1),
    ),
    "lean-ddp-hooks-again": Table(
        "docs/PERFORMANCE.md",
        "**The DDP hooks again, 2026-11-28**",
        "runs/lean-engine/ddp-2026-11-28/",
        lean_ddp_table_again,
    ),
}


def table_lines(text: str) -> list:
    """The lines of the first Markdown table in ``text`` (stripped)."""
    lines, started = [], False
    for line in text.splitlines():
        if line.strip().startswith("|"):  # indented: a table inside a list item
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
    quoted, figures = citations.problems(args.root, TABLES)
    for problem in quoted:
        print(problem, file=sys.stderr)
    claims = len(citations.citations(args.root))
    print(
        f"{figures - len(quoted)} of {figures} figures quoted in prose ({claims} claims citing "
        "a table) match their tables"
    )
    return 1 if problems or quoted else 0


if __name__ == "__main__":
    sys.exit(main())
