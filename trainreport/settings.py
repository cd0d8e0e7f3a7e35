"""Grouping and labelling runs by the settings their rows record, never by their folder names.

Runs are compared only within a group: the same model, data set, worker count and network
(``network``: the rate of a shaped network, or ``loopback``), where the rows record them. Within
a group a run is labelled by its method and, where runs of that method differ in them, its
method settings (density, teams, SAG variant, SRS variant, wire format: a run that does not
record its wire sent fp32; PowerSGD's rank and start_iter).
"""

from __future__ import annotations

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
    differ (``spardl (teams 2, sag recursive)``). Runs whose settings are all the same (repeats)
    get their folder name added, then the path as given, and last a number.
    """
    for run in runs:
        run.group = group_key(run)
    for run in runs:
        peers = [other for other in runs if other.group == run.group and other.method == run.method]
        differing = [
            key for key in SETTINGS if len({repr(peer.setting(key)) for peer in peers}) > 1
        ]
        run.label = run.method + (
            f" ({', '.join(f'{key} {format_setting(run.setting(key))}' for key in differing)})"
            if differing
            else ""
        )
    for extra in (
        lambda run, _: f"{run.label} [{_folder(run.path)}]",
        lambda run, _: f"{run.label.rsplit(' [', 1)[0]} [{run.path}]",
        lambda run, number: f"{run.label} #{number}",
    ):
        seen: dict = {}
        for run in runs:
            seen.setdefault((run.group, run.label), []).append(run)
        for clashing in (members for members in seen.values() if len(members) > 1):
            for number, run in enumerate(clashing, 1):
                run.label = extra(run, number)
    return runs


def _folder(path: str) -> str:
    """The last component of a run's path (its directory, or the file's name)."""
    return path.rstrip("/").rsplit("/", 1)[-1]
