"""The report's Markdown: per group, time per iteration and accuracy; across networks, a sweep.

Speed-ups are the ``reference`` method's (``spardl`` by default): a run's time divided by the
group's first reference run's time, so above 1 where the reference is faster.
"""

from __future__ import annotations

from trainreport.runs import accuracy_name
from trainreport.settings import (
    GROUP_KEYS,
    format_setting,
    group_key,
    group_title,
    groups,
    shown_settings,
)

__all__ = ["markdown", "reference_run", "speedups", "time_table", "accuracy_table", "network_sweep"]


def markdown(runs: list, reference: str, target: float = None, figures: list = ()) -> str:
    """The tables of every group, the network sweep, and links to the figures.

    The sweep covers networks where runs differ only in it; the links go to each of ``figures``
    (file names beside the Markdown).
    """
    out = []
    for key, members in groups(runs).items():
        out.append(f"## {group_title(key)}\n")
        out.append(time_table(members, reference))
        out.append(accuracy_table(members, reference, target))
    out += [
        sweep
        for sweep in (network_sweep(members, reference) for members in _by_setup(runs).values())
        if sweep
    ]
    if figures:
        out.append(
            "## Figures\n\n"
            + "\n".join(f"![{name.rsplit('.', 1)[0]}]({name})" for name in figures)
            + "\n"
        )
    return "\n".join(out)


def reference_run(runs: list, reference: str):
    """The first run of the ``reference`` method among ``runs``, whose times the speed-ups divide.

    ``None`` if there is none.
    """
    return next((run for run in runs if run.method == reference), None)


def speedups(runs: list, reference: str) -> dict:
    """The ``reference`` method's speed-ups over each run.

    ``{run label: (speed-up in time per iteration, in synchronization time)}`` of the ``reference``
    method's first run over each of ``runs``; ``{}`` without a reference run. A ratio is ``None``
    where the reference's time is zero.
    """
    base = reference_run(runs, reference)
    if base is None:
        return {}
    ref = base.per_iteration()
    return {
        run.label: tuple(
            run.per_iteration()[key] / ref[key] if ref[key] > 0 else None
            for key in ("total", "sync")
        )
        for run in runs
    }


def time_table(runs: list, reference: str) -> str:
    """The time table: time per iteration and its split, settings, overlap, traffic, speed-up.

    Time per iteration and its split (``Run.per_iteration``), the share of the synchronization
    that overlapped compute, the settings, megabytes sent per rank,
    and the reference method's speed-up over each run (the group's first run of that method, named
    above the table when there are several).
    """
    base = reference_run(runs, reference)
    which = f" ({base.label})" if sum(run.method == reference for run in runs) > 1 else ""
    settings = shown_settings(runs)
    ratios = speedups(runs, reference)
    header = [
        "run",
        *settings,
        "ms/iter",
        "compute",
        "select",
        "comm",
        "other sync",
        "sync",
        "exposed",
        "overlap",
        "rest",
        "MB/iter",
        f"{reference} speedup",
        f"{reference} sync speedup",
    ]
    lines = [
        f"Time per iteration (ms); overlap = the share of sync hidden behind compute "
        f"(1 - exposed / sync); speedup = this run's time / {reference}{which}'s.\n",
        "| " + " | ".join(header) + " |",
        "|---|" + "---|" * len(settings) + "---:|" * (len(header) - 1 - len(settings)),
    ]
    for run in runs:
        t = run.per_iteration()
        cells = [
            run.label,
            *(format_setting(run.setting(key)) for key in settings),
            *(
                f"{t[key] * 1e3:.1f}"
                for key in ("total", "compute", "select", "comm", "other", "sync", "exposed")
            ),
            _percent(t["overlap"]),
            f"{t['rest'] * 1e3:.1f}",
            f"{t['bytes'] / 1e6:.3f}",
            *(_ratio(value) for value in ratios.get(run.label, (None, None))),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def accuracy_table(runs: list, reference: str = "spardl", target: float = None) -> str:
    """The accuracy table: accuracies, losses, epochs and wall time per run.

    Final and best test accuracy, final losses, epochs ("63 of 400" for a run that stopped early)
    and wall time per run; with a ``target`` accuracy also the epoch and wall time at which each run
    first reached it and the ``reference`` method's speed-up in that time (this run's time / the
    group's first reference run's).

    For masked-language-model runs (BERT) the headers say what the numbers are: masked-token
    accuracy on held-out text, the masked-LM loss, and a column of test perplexity.
    """
    masked_lm = all(run.masked_lm for run in runs)
    acc, loss = ("masked-token acc", "MLM loss") if masked_lm else ("test acc", "loss")
    header = (
        f"| run | epochs | final {acc} | best {acc} | final train {loss} | final test {loss} |"
        + (" final test perplexity |" if masked_lm else "")
        + " wall s |"
    )
    if target is not None:
        header += (
            f" epoch to {target:g} | wall s to {target:g} | {reference} speedup to {target:g} |"
        )
    lines = [header, "|---|" + "---:|" * (header.count("|") - 2)]
    if masked_lm:
        lines.insert(
            0,
            "Accuracy is masked-token accuracy: the fraction of masked tokens of the held-out "
            "text that the model predicts exactly.\n",
        )
    elif any(run.masked_lm for run in runs):
        lines.insert(0, f"Accuracy is {accuracy_name(runs)}.\n")
    base = reference_run(runs, reference)
    reference_time = base.time_to(target) if target is not None and base else None
    for run in runs:
        last = run.rows[-1]
        accuracies = [r["test_acc"] for r in run.rows if r.get("test_acc") is not None]
        epochs = f"{last['epoch']}" + (
            f" of {last['max_epochs']}" if last.get("max_epochs", 0) > last["epoch"] else ""
        )
        line = (
            f"| {run.label} | {epochs} | {_number(last.get('test_acc'), 4)} | "
            f"{_number(max(accuracies) if accuracies else None, 4)} | "
            f"{_number(last.get('train_loss'), 4)} | "
            f"{_number(last.get('test_loss'), 4)} |"
            + (f" {_number(last.get('test_perplexity'), 2)} |" if masked_lm else "")
            + f" {run.wall_times()[-1]:.1f} |"
        )
        if target is not None:
            reached = run.time_to(target)
            if reached is None:
                line += " not reached | - | - |"
            else:
                speedup = (
                    _ratio(reached[1] / reference_time[1])
                    if reference_time and reference_time[1] > 0
                    else "-"
                )
                line += f" {reached[0]} | {reached[1]:.1f} | {speedup} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def network_sweep(runs: list, reference: str) -> str:
    """For runs of one model, data set and worker count on several networks.

    Ms per iteration of every run label (column) on every network (row), with the reference's
    speed-up over it in parentheses; ``""`` where the runs do not span several networks.
    """
    by_network = groups(runs)
    if len(by_network) < 2:
        return ""
    labels = list(dict.fromkeys(run.label for run in runs))
    setup = [(title, value) for title, value in next(iter(by_network)) if title != "network"]
    lines = [
        f"## {group_title(tuple(setup))}: time per iteration by network\n",
        f"ms per iteration ({reference}'s speed-up over the run).\n",
        "| network | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for key, members in by_network.items():
        ratios = speedups(members, reference)
        cells = {
            run.label: f"{run.per_iteration()['total'] * 1e3:.1f}"
            + (f" ({_ratio(ratios[run.label][0])})" if run.label in ratios else "")
            for run in members
        }
        lines.append(
            f"| {dict(key).get('network', '-')} | "
            + " | ".join(cells.get(label, "-") for label in labels)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _by_setup(runs: list) -> dict:
    """Runs by their group key without the network, in first-seen order."""
    keys = tuple(pair for pair in GROUP_KEYS if pair[0] != "network")
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(group_key(run, keys), []).append(run)
    return grouped


def _percent(share) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _number(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
