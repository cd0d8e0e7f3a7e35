"""The report's figures, one panel per group.

Test accuracy against epochs and wall time, the time split per iteration, and the reference method's
speed-up over every run.
"""

from __future__ import annotations

import os
import textwrap

from trainreport.runs import Run, accuracy_name
from trainreport.settings import group_title, groups
from trainreport.tables import speedups

__all__ = ["FIGURES", "plot"]

#: The figures :func:`plot` writes, in order.
FIGURES = ("accuracy_vs_epoch.png", "accuracy_vs_time.png", "time_split.png", "speedup.png")


def plot(runs: list, out_dir: str, reference: str, target: float = None) -> list:
    """Write :data:`FIGURES` into ``out_dir`` and return their paths.

    A dashed line marks the ``target`` accuracy if one is given.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = list(groups(runs).items())
    paths = [
        _save(_accuracy_figure(plt, grouped, name, x_of, target), plt, out_dir, name)
        for name, x_of in (
            ("accuracy_vs_epoch", lambda r: [row["epoch"] for row in r.rows]),
            ("accuracy_vs_time", Run.wall_times),
        )
    ]
    width = max(4.5, 1.5 + 1.3 * max(len(m) for _, m in grouped))  # per group: room for its title
    paths.append(_save(_time_split_figure(plt, grouped, width), plt, out_dir, "time_split"))
    paths.append(_save(_speedup_figure(plt, grouped, width, reference), plt, out_dir, "speedup"))
    return paths


def _accuracy_figure(plt, grouped: list, name: str, x_of, target: float = None):
    """Test accuracy against ``x_of(run)`` (epochs or wall seconds), a panel per group."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(grouped), figsize=(5.5 * len(grouped), 4), squeeze=False)
    for axis, (key, members) in zip(axes[0], grouped):
        for run in members:
            points = [
                (x, row["test_acc"])
                for x, row in zip(x_of(run), run.rows)
                if row.get("test_acc") is not None
            ]
            if points:
                axis.plot(*zip(*points), marker=".", label=run.label)
        axis.set(
            xlabel="epoch" if name.endswith("epoch") else "wall time (s)",
            ylabel=accuracy_name(members),
            title=_title(key),
        )
        if name.endswith("epoch"):
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs only
        if axis.lines:
            if target is not None:
                axis.axhline(
                    target,
                    color="gray",
                    linestyle="--",
                    linewidth=1,
                    label=f"target {target:g}",
                )
            axis.legend(fontsize=8)
        else:
            axis.text(
                0.5,
                0.5,
                f"no {accuracy_name(members)} logged",
                ha="center",
                transform=axis.transAxes,
            )
    return fig


def _time_split_figure(plt, grouped: list, width: float):
    """Each run's milliseconds per iteration as stacked bars of its parts, a panel per group."""
    fig, axes = plt.subplots(1, len(grouped), figsize=(width * len(grouped), 4), squeeze=False)
    for axis, (key, members) in zip(axes[0], grouped):
        bottom = [0.0] * len(members)
        for part in ("compute", "select", "comm", "other", "rest"):
            heights = [run.per_iteration()[part] * 1e3 for run in members]
            axis.bar([run.label for run in members], heights, bottom=bottom, label=part)
            bottom = [b + h for b, h in zip(bottom, heights)]
        axis.set(ylabel="ms per iteration", title=_title(key))
        axis.tick_params(axis="x", rotation=30)
        axis.legend(fontsize=8)
    return fig


def _speedup_figure(plt, grouped: list, width: float, reference: str):
    """The ``reference`` method's speed-up over every other run, a panel per group.

    Bars of the speed-up per iteration and in synchronization; a note where there is none.
    """
    fig, axes = plt.subplots(1, len(grouped), figsize=(width * len(grouped), 4), squeeze=False)
    for axis, (key, members) in zip(axes[0], grouped):
        ratios = speedups(members, reference)
        others = [run.label for run in members if run.label in ratios and run.method != reference]
        if others:
            positions = range(len(others))
            for offset, (index, part) in (
                (-0.2, (0, "per iteration")),
                (0.2, (1, "synchronization")),
            ):
                axis.bar(
                    [p + offset for p in positions],
                    [ratios[label][index] or 0.0 for label in others],
                    width=0.4,
                    label=part,
                )
            axis.set_xticks(list(positions), others, rotation=30)
            axis.axhline(1.0, color="gray", linestyle="--", linewidth=1)
            axis.legend(fontsize=8)
        else:
            axis.text(
                0.5,
                0.5,
                f"no {reference} run, or nothing to compare it with",
                ha="center",
                transform=axis.transAxes,
            )
        axis.set(ylabel=f"{reference}'s speed-up (x)", title=_title(key))
    return fig


def _title(key: tuple) -> str:
    """A panel's title: the group, wrapped to the width of the narrowest panel."""
    return textwrap.fill(group_title(key), 48)


def _save(fig, plt, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
