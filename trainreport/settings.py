"""Grouping and labelling runs by the settings their rows record, never by their folder names.

Runs are compared only within a group: the same model, data set, worker count and network
(``network``: the rate of a shaped network, or ``loopback``), where the rows record them. Within
a group a run is labelled by its method and, where runs of that method differ in them, its
method settings (density, teams, SAG variant, SRS variant, wire format: a run that does not
record its wire sent fp32; PowerSGD's rank and start_iter). Runs that share a label are told
apart by the other settings their rows record in which they differ (any method option such as
``momentum``, ``batch_size``, ``max_epochs``, ``bucket_mb`` ...); runs that record the same
settings throughout (repeats, such as seeds: rows do not record the seed) are numbered ``#1``,
``#2`` ... in the order given.
"""

from __future__ import annotations

__all__ = [
    "GROUP_KEYS",
    "SETTINGS",
    "ALWAYS_SHOWN",
    "IMPLIED",
    "MEASURED",
    "group_key",
    "group_title",
    "groups",
    "shown_settings",
    "format_setting",
    "label_runs",
]

#: (title, row key) of what puts runs into one group.
GROUP_KEYS = (
    ("model", "model"),
    ("dataset", "dataset"),
    ("workers", "nworkers"),
    ("network", "network"),
)
#: Method settings: table columns, and parts of a label where runs of one method differ.
SETTINGS = ("density", "teams", "sag", "srs", "wire", "rank", "start_iter")
#: Settings that always get a column; the others only where some run of the group records them.
ALWAYS_SHOWN = ("density", "teams", "sag")
#: The value of a setting in runs whose rows do not record it (runs from before it existed);
#: a setting with one gets a column only where some run of the group differs from it.
IMPLIED = {"wire": "fp32"}
#: Row keys that are measurements of an epoch (or follow from the settings), not settings: the
#: keys a label never names. Every other key of a row is a setting of the run.
MEASURED = (
    "epoch",
    "iters",
    "epoch_iters",
    "within_epoch",
    "train_loss",
    "test_loss",
    "test_acc",
    "test_perplexity",
    "lr",
    "epoch_seconds",
    "compute_seconds",
    "sync_seconds",
    "exposed_sync_seconds",
    "select_seconds",
    "comm_seconds",
    "bytes_sent_per_rank",
    "eval_seconds",
    "auto",
    "effective_density",
)


def group_key(run, keys=GROUP_KEYS) -> tuple:
    """``((title, value), ...)`` of the ``keys`` the run's rows record."""
    last = run.rows[-1]
    return tuple((title, last[key]) for title, key in keys if key in last)


def group_title(key: tuple) -> str:
    """``model cnn, dataset digits, workers 4, network 1gbit`` for a group key."""
    return ", ".join(f"{name} {value}" for name, value in key) or "runs"


def groups(runs: list) -> dict:
    """Runs by group key, in first-seen order."""
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(run.group, []).append(run)
    return grouped


def shown_settings(runs: list) -> list:
    """The settings that get a column in a table of ``runs``."""
    return [
        key
        for key in SETTINGS
        if key in ALWAYS_SHOWN
        or any(run.setting(key) not in (None, IMPLIED.get(key)) for run in runs)
    ]


def format_setting(value) -> str:
    """A setting as a table cell: ``-`` where the run does not record it."""
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def label_runs(runs: list) -> list:
    """Set every run's group and a label unique within its group, and return ``runs``.

    The label is the method, followed by the settings in which the group's runs of that method
    differ (``spardl (teams 2, sag recursive)``). Runs that would share a label get the other
    recorded settings in which they differ added (``spardl (momentum 0.9)``), and runs that
    record the same settings throughout (repeats) a number in the order given (``spardl #2``).
    Never the folder name: a label says what was run, not where its rows were kept.
    """
    for run in runs:
        run.group = group_key(run)
    named = {}  # id(run) -> the settings its label names
    for run in runs:
        peers = [other for other in runs if other.group == run.group and other.method == run.method]
        named[id(run)] = _differing(peers, SETTINGS)
    for clashing in _clashes(runs, named):
        others = sorted({key for run in clashing for key in run.rows[-1]} - _NOT_OTHER)
        for run in clashing:
            named[id(run)] = named[id(run)] + _differing(clashing, others)
    for clashing in _clashes(runs, named):
        for number, run in enumerate(clashing, 1):
            run.label = f"{run.label} #{number}"
    return runs


#: Keys that are no other setting: measurements, the group's keys, the method and its settings.
_NOT_OTHER = {*MEASURED, *(key for _, key in GROUP_KEYS), "compressor", *SETTINGS}


def _differing(runs: list, keys) -> list:
    """The ``keys`` whose setting is not the same in all of ``runs``."""
    return [key for key in keys if len({repr(run.setting(key)) for run in runs}) > 1]


def _clashes(runs: list, named: dict) -> list:
    """Label every run by its method and the settings ``named`` gives it.

    Returns the lists of runs of one group that share a label, each in the order given.
    """
    seen: dict = {}
    for run in runs:
        keys = named[id(run)]
        run.label = run.method + (
            f" ({', '.join(f'{key} {format_setting(run.setting(key))}' for key in keys)})"
            if keys
            else ""
        )
        seen.setdefault((run.group, run.label), []).append(run)
    return [members for members in seen.values() if len(members) > 1]
