"""Predictions beside measurements.

Each method row of a benchmark JSON (``scripts/bench_allreduce.py --json``) predicted by the
simulator at the same P, n, density and SparDL settings, on the network the row records (a shaped
rate becomes the testbed's shared link, :class:`syncbench.network.SharedLink`) or on networks given
instead.
"""

from __future__ import annotations

import argparse
import json

import compressors

from . import plan
from .floor import FLOORS
from .network import TESTBED_ALPHA, parse_network
from .simulator import simulate_row

__all__ = [
    "NEEDED",
    "load_bench_rows",
    "measured_network",
    "row_options",
    "compare",
    "format_comparison",
]

NEEDED = ("method", "label", "workers", "numel", "density", "median_ms")


def load_bench_rows(path: str) -> list:
    """The method rows of a benchmark JSON file (the floor rows left out).

    ``ValueError`` when the file cannot be read or holds no benchmark rows.
    """
    try:
        with open(path) as handle:
            rows = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--compare {path}: {error}") from None
    if (
        not isinstance(rows, list)
        or not rows
        or not all(isinstance(r, dict) and set(NEEDED) <= set(r) for r in rows)
    ):
        raise ValueError(
            f"--compare {path}: not a benchmark JSON (a list of rows with {', '.join(NEEDED)})"
        )
    return [row for row in rows if row["method"] not in FLOORS]


def measured_network(row: dict, message_cost: float = TESTBED_ALPHA, cores: int | None = None):
    """The testbed model of the network a benchmark row ran on.

    ``shared:RATE`` for a row whose ``network`` is a shaped rate; ``ValueError`` for loopback, a
    replay or a row without one (those have no rate to model: give networks to compare them with).
    """
    name = row.get("network")
    if name in (None, "loopback", "none"):
        raise ValueError(
            f"--compare: the row {row['label']} at P={row['workers']} ran on "
            f"{name or 'an unrecorded network'}, which has no rate: name the networks to "
            f"predict it on with --network"
        )
    return parse_network(f"shared:{name}", message_cost, cores)


def row_options(row: dict) -> dict:
    """The method options a benchmark row ran with.

    Its ``options``, or in rows written before they were recorded, the row's keys that are options
    of its method (SparDL's ``teams``, ``srs``, ``sag``). A row's ``wire`` other than fp32 is one
    of them (rows without one sent fp32). A ``teams="auto"`` row gives the configuration its
    probe chose.
    """
    if isinstance(row.get("options"), dict):
        options = dict(row["options"])
    else:
        valid = (
            compressors.options(row["method"]) if row["method"] in compressors.available() else []
        )
        options = {key: row[key] for key in valid if row.get(key) is not None}
    if options.get("teams") == "auto" and isinstance(row.get("teams"), int):
        # Predict the configuration the probe chose, not a new probe in this process.
        options.update({key: row[key] for key in ("teams", "sag", "layout") if key in row})
    if row.get("wire", plan.WIRE_DEFAULT) != plan.WIRE_DEFAULT:
        options.setdefault("wire", row["wire"])
    elif options.get("wire") == plan.WIRE_DEFAULT:
        del options["wire"]
    return options


def compare(
    bench_rows: list,
    settings,
    cost,
    networks: list = None,
    message_cost: float = TESTBED_ALPHA,
    cores: int | None = None,
    local_work=None,
) -> list:
    """One row per benchmark row and network, measured beside predicted.

    The networks are ``networks``, else the row's own (:func:`measured_network`, with
    ``message_cost`` and ``cores``). A row holds ``measured_ms`` (the row's median),
    ``predicted_ms``, ``error_pct`` = 100 (predicted - measured) / measured, and both splits.
    ``settings`` gives the simulated ``numel`` (at most the row's n), ``warmup``, ``calls`` and
    ``seed``; the predicted n and the density are the row's. ``local_work``: the simulator's
    replayed local-work model (its larger replay size at most the row's n), ``None`` for selection
    only.
    """
    out = []
    for row in bench_rows:
        options = row_options(row)
        local = argparse.Namespace(
            numel=min(settings.numel, row["numel"]),
            model_numel=row["numel"],
            density=row["density"],
            warmup=settings.warmup,
            calls=settings.calls,
            seed=settings.seed,
        )
        targets = networks or [measured_network(row, message_cost, cores)]
        for predicted in simulate_row(
            row["label"], row["method"], options, row["workers"], local, targets, cost, local_work
        ):
            out.append(
                {
                    "label": row["label"],
                    "method": row["method"],
                    "workers": row["workers"],
                    "numel": row["numel"],
                    "density": row["density"],
                    "wire": plan.row_wire(options),
                    "measured_network": row.get("network"),
                    "network": predicted["network"],
                    "measured_ms": row["median_ms"],
                    "predicted_ms": predicted["predicted_ms"],
                    "error_pct": 100
                    * (predicted["predicted_ms"] - row["median_ms"])
                    / row["median_ms"],
                    "predicted_network_ms": predicted["network_ms"],
                    "predicted_select_ms": predicted["select_ms"],
                    "local_work": predicted["local_work"],
                    "predicted_local_ms": predicted["local_ms"],
                    "measured_comm_ms": row.get("comm_ms"),
                    "measured_select_ms": row.get("select_ms"),
                }
            )
    return out


def format_comparison(rows: list) -> str:
    """The comparison as a text table, and per method the mean absolute error over its rows.

    ``pred local`` is the local-work term added to ``pred net`` (``--local-work select``: the
    selection, ``pred sel``; ``replay``: the replayed local work, ``pred sel`` being part of it).
    """
    width = max(14, 2 + max(len(r["label"]) for r in rows))
    net = max(16, 2 + max(len(r["network"]) for r in rows))  # cluster names are long
    header = (
        f"{'method':<{width}}{'P':>4}{'network':>{net}}{'measured ms':>13}{'predicted ms':>14}"
        f"{'error %':>9}"
        f"{'pred net':>10}{'pred sel':>10}{'pred local':>12}{'meas comm':>11}{'meas sel':>10}"
    )
    lines = [header, "-" * len(header)]

    def ms(value):
        return "-" if value is None else f"{value:.1f}"

    for r in rows:
        lines.append(
            f"{r['label']:<{width}}{r['workers']:>4}{r['network']:>{net}}{r['measured_ms']:>13.1f}"
            f"{r['predicted_ms']:>14.1f}{r['error_pct']:>+9.1f}{r['predicted_network_ms']:>10.1f}"
            f"{r['predicted_select_ms']:>10.1f}{r['predicted_local_ms']:>12.1f}{ms(r['measured_comm_ms']):>11}"
            f"{ms(r['measured_select_ms']):>10}"
        )
    errors = {}
    for r in rows:
        errors.setdefault(r["label"], []).append(abs(r["error_pct"]))
    lines.append(
        "mean |error| per method: "
        + ", ".join(f"{label} {sum(e) / len(e):.0f}%" for label, e in errors.items())
    )
    return "\n".join(lines)
