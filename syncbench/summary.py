"""The benchmark's rows.

Per-call records of every rank summarized into one row per method (:func:`summarize`), and the rows
as a text table, CSV and a chart.
"""

from __future__ import annotations

import csv
import statistics

import numpy as np

from .timing import PHASES

__all__ = ["summarize_counts", "summarize", "format_table", "write_csv", "plot"]


def summarize_counts(per_rank: list) -> dict:
    """Traffic and nnz over the timed calls; ``per_rank[r][c]`` is rank r's record of call c.

    ``bytes_per_rank`` and ``messages`` are means over calls and ranks, ``bytes_max_rank`` the
    mean over calls of the busiest rank, ``rounds`` and ``host_syncs`` (the transport's waits for
    a GPU) the most any rank counted in any call, and
    ``nnz`` the median over calls (rank 0's; results are identical on all ranks).
    """
    calls = range(len(per_rank[0]))
    workers = len(per_rank)
    return {
        "bytes_per_rank": statistics.fmean(
            sum(r[c]["bytes"] for r in per_rank) / workers for c in calls
        ),
        "bytes_max_rank": statistics.fmean(max(r[c]["bytes"] for r in per_rank) for c in calls),
        "messages": statistics.fmean(
            sum(r[c]["messages"] for r in per_rank) / workers for c in calls
        ),
        "rounds": max(r[c]["rounds"] for r in per_rank for c in calls),
        "host_syncs": max(r[c]["host_syncs"] for r in per_rank for c in calls),
        "nnz": statistics.median_low(per_rank[0][c]["nnz"] for c in calls),
    }


def summarize(
    label: str, name: str, options: dict, per_rank: list, args, workers: int, numel: int
) -> dict:
    """One table/JSON row from every rank's timed records ``per_rank[r][c]``.

    A call takes as long as its slowest rank, so every time is that of the call's slowest rank,
    and so is its split into phases; the row holds the median over the calls and the min, max
    and quartiles. ``args`` gives the settings the row records (``density``, ``iters``,
    ``warmup``, ``seed``, ``gradient``, ``replay``).
    """
    calls = range(len(per_rank[0]))
    # Per call, the record of its slowest rank: its time is the call's, and its phases split it.
    critical = [max((r[c] for r in per_rank), key=lambda record: record["seconds"]) for c in calls]
    slowest = [record["seconds"] * 1e3 for record in critical]
    q1, _, q3 = statistics.quantiles(slowest, n=4) if len(slowest) > 1 else (slowest[0],) * 3
    row = {
        "method": name,
        "label": label,
        "teams": options.get("teams", 1),
        "srs": options.get("srs"),
        "sag": options.get("sag"),
        "options": dict(options),
        "workers": workers,
        "numel": numel,
        "density": args.density,
        "median_ms": statistics.median(slowest),
        "min_ms": min(slowest),
        "max_ms": max(slowest),
        "q1_ms": q1,
        "q3_ms": q3,
    }
    for phase in PHASES:
        row[f"{phase}_ms"] = statistics.median(record[phase] * 1e3 for record in critical)
    row.update(summarize_counts(per_rank))
    cosines = [per_rank[0][c]["cosine"] for c in calls]
    if cosines[0] is not None:  # a NaN (non-finite result) shows, instead of sorting at random
        cosines = [float("nan")] if np.isnan(cosines).any() else cosines
    row["cosine"] = None if cosines[0] is None else statistics.median(cosines)
    if "lost_mass" in per_rank[0][0]:
        row["lost_mass"] = statistics.fmean(r[c]["lost_mass"] for r in per_rank for c in calls)
    row.update(
        iters=args.iters,
        warmup=args.warmup,
        seed=args.seed,
        gradient=args.gradient,
        replay=args.replay,
    )
    return row


def format_table(rows: list) -> str:
    """The rows as an aligned text table.

    With each method's ratios to the two floor rows (``floor_ratio``, ``ef_floor_ratio``).
    """
    width = max(14, 2 + max(len(r["label"]) for r in rows))
    header = (
        f"{'method':<{width}}{'P':>4}{'median ms':>11}{'min-max ms':>17}{'select':>9}{'comm':>9}"
        f"{'accum':>9}{'MB/rank':>9}{'msgs':>7}{'rounds':>7}{'nnz':>10}{'cosine':>9}{'x floor':>8}"
        f"{'x ef':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        spread = f"{r['min_ms']:.1f}-{r['max_ms']:.1f}"
        cos = "-" if r["cosine"] is None else f"{r['cosine']:.4f}"
        ratios = [f"{r[key]:.2f}" for key in ("floor_ratio", "ef_floor_ratio")]
        lines.append(
            f"{r['label']:<{width}}{r['workers']:>4}{r['median_ms']:>11.1f}{spread:>17}"
            f"{r['select_ms']:>9.1f}{r['comm_ms']:>9.1f}{r['accumulate_ms']:>9.1f}"
            f"{r['bytes_per_rank'] / 1e6:>9.3f}{r['messages']:>7.1f}{r['rounds']:>7}"
            f"{r['nnz']:>10}{cos:>9}{ratios[0]:>8}{ratios[1]:>7}"
        )
    return "\n".join(lines)


def write_csv(rows: list, path: str) -> None:
    """The rows as CSV, one column per key of any row."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list, path: str) -> None:
    """Bar charts of the median time split by phase and of the bytes per rank.

    The times have min-max whiskers; the bytes are on a log scale, so sparse methods' bars stay
    visible beside dense.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    x = np.arange(len(rows))
    fig, (times, traffic) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(rows), 4.5))
    bottom = np.zeros(len(rows))
    for phase in PHASES:
        heights = np.array([r[f"{phase}_ms"] for r in rows])
        times.bar(x, heights, bottom=bottom, label=phase)
        bottom += heights
    medians = np.array([r["median_ms"] for r in rows])
    spread = [medians - [r["min_ms"] for r in rows], [r["max_ms"] for r in rows] - medians]
    times.errorbar(x, medians, yerr=spread, fmt="k_", capsize=4, label="median (min-max)")
    times.set_ylabel("ms per call (slowest rank)")
    times.legend(fontsize=8)
    traffic.bar(x, [r["bytes_per_rank"] / 1e6 for r in rows], color="tab:gray")
    traffic.set_ylabel("MB sent per rank")
    traffic.set_yscale("log")
    first = rows[0]
    for axis in (times, traffic):
        axis.set_xticks(x, labels, rotation=30, ha="right")
    fig.suptitle(
        f"P={first['workers']}, n={first['numel']:,}, density={first['density']}, "
        f"network {first['network']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
