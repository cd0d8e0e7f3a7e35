"""Which rows a benchmark or simulation times.

Every method once, SparDL once per team count d, Spar-Reduce-Scatter execution,
Spar-All-Gather variant and team layout that applies at P workers, each of them once per wire
format; ``teams="auto"`` (:data:`AUTO`) once per execution, since it chooses d, the variant and
the layout itself. SparDL's defaults and choices come from the registry
(``compressors.option_defaults`` and ``compressors.option_choices``), and so does the decision
whether a setting applies at P (``compressors.check_options``).
"""

from __future__ import annotations

import allreducers
import compressors
from compressors.teams import LAYOUTS, layout_differs

__all__ = [
    "SPARDL",
    "SRS_DEFAULT",
    "SAG_DEFAULT",
    "SRS_CHOICES",
    "SAG_CHOICES",
    "LAYOUT_DEFAULT",
    "LAYOUT_CHOICES",
    "AUTO",
    "SWEPT",
    "WIRES",
    "WIRE_DEFAULT",
    "spardl_label",
    "label",
    "spardl_skip_reason",
    "method_runs",
    "row_wire",
    "skipped",
]

SPARDL = "spardl"
SRS_DEFAULT = compressors.option_defaults(SPARDL)["srs"]
SAG_DEFAULT = compressors.option_defaults(SPARDL)["sag"]
SRS_CHOICES = compressors.option_choices(SPARDL)["srs"]
SAG_CHOICES = compressors.option_choices(SPARDL)["sag"]
LAYOUT_DEFAULT = compressors.option_defaults(SPARDL)["layout"]
LAYOUT_CHOICES = LAYOUTS
#: ``--teams auto``: SparDL chooses d, its Spar-All-Gather variant and its layout itself.
AUTO = "auto"
#: SparDL's options that the benchmark and the simulator sweep with flags of their own.
SWEPT = ("teams", "srs", "sag", "layout")
#: The wire formats (``--wire``, every method's option ``wire``) and the default, fp32.
WIRES = allreducers.WIRES
WIRE_DEFAULT = compressors.option_defaults(SPARDL)["wire"]


def spardl_label(teams: int, srs: str = SRS_DEFAULT, sag: str = SAG_DEFAULT) -> str:
    """A SparDL row's label: ``spardl``, with what differs from the defaults in parentheses.

    For example ``spardl(d=2)``, ``spardl(blocks)``, ``spardl(d=4,recursive)``,
    ``spardl(d=4,blocks,recursive)`` or ``spardl(d=auto)``.
    """
    return label(SPARDL, {"teams": teams, "srs": srs, "sag": sag})


def label(name: str, options: dict) -> str:
    """A row's label: the method, with its options that differ from the defaults in parentheses.

    SparDL's swept options are written short (``d=4``, ``d=auto``, ``blocks``, ``recursive``,
    ``strided``), any other option as ``key=value`` (``oktopk(in_flight=2)``).
    """
    defaults = compressors.option_defaults(name)
    parts = []
    for key, value in options.items():
        if value == defaults.get(key):
            continue
        if name == SPARDL and key == "teams":
            parts.append(f"d={value}")
        elif name == SPARDL and key in SWEPT:
            parts.append(str(value))
        else:
            parts.append(f"{key}={value}")
    return f"{name}({','.join(parts)})" if parts else name


def spardl_skip_reason(teams, sag: str, workers: int, layout: str = LAYOUT_DEFAULT):
    """Why SparDL with ``teams``, ``sag`` and ``layout`` does not apply at P = ``workers``.

    Returns:
        A note for stderr, or ``None`` where it applies. A variant other than the default with
        one team is skipped too: without Spar-All-Gather it is the default's row again; so is a
        layout other than the default where its teams are the default's (d = 1 or d = P).
        ``teams`` :data:`AUTO` always applies (it chooses the variant and the layout itself).
    """
    if teams == AUTO:
        return None
    try:
        compressors.check_options(SPARDL, workers, teams=teams)
    except ValueError:
        return f"--teams {teams} skipped: a team count must divide P = {workers}"
    if sag != SAG_DEFAULT and teams == 1:
        return (
            f"--sag {sag} skipped at d=1: one team has no Spar-All-Gather (the {SAG_DEFAULT} row)"
        )
    try:
        compressors.check_options(SPARDL, workers, teams=teams, sag=sag)
    except ValueError as error:
        return f"--sag {sag} skipped at d={teams}: {error}"
    if layout != LAYOUT_DEFAULT and not layout_differs(teams, workers):
        return (
            f"--layout {layout} skipped at d={teams}: with d = 1 or d = P its teams are the "
            f"{LAYOUT_DEFAULT} layout's (that row)"
        )
    return None


def method_runs(
    methods: list,
    teams: list,
    workers: int,
    srs: tuple = (SRS_DEFAULT,),
    sag: tuple = (SAG_DEFAULT,),
    options: dict = None,
    wires: tuple = (WIRE_DEFAULT,),
    layouts: tuple = (LAYOUT_DEFAULT,),
) -> list:
    """``(label, name, options)`` for every row.

    Each method once, spardl once per team count d, execution ``srs``, variant ``sag`` and
    layout of ``layouts`` that apply at P = ``workers`` (:func:`skipped` says which do not;
    ``teams`` :data:`AUTO` once per execution, with neither variant nor layout), each once per wire
    format of ``wires``, one after another. ``options``: further options per method
    (``{"oktopk": {"in_flight": 2}}``, from ``--method-option``), in every row of that method
    and in its label (:func:`label`). A row's options hold ``wire`` where it is not fp32
    (labelled ``topk(wire=fp16)``), so fp32 rows are those of before the wire existed; a
    method without the option ``wire`` (one registered from outside) gets one row, its fp32 one.
    """
    settings = []
    for name in methods:
        extra = (options or {}).get(name, {})
        if name != SPARDL:
            settings.append((name, dict(extra)))
            continue
        for d in teams:
            if d == AUTO:
                settings += [(name, {"teams": d, "srs": execution, **extra}) for execution in srs]
                continue
            for variant in sag:
                for layout in layouts:
                    if spardl_skip_reason(d, variant, workers, layout) is None:
                        chosen = {"teams": d, "sag": variant}
                        if layout != LAYOUT_DEFAULT:
                            chosen["layout"] = layout
                        settings += [
                            (name, {"teams": d, "srs": execution, **chosen, **extra})
                            for execution in srs
                        ]
    runs = []
    for name, chosen in settings:
        takes_wire = "wire" in compressors.options(name)
        for wire in wires if takes_wire else (WIRE_DEFAULT,):
            with_wire = dict(chosen, wire=wire) if wire != WIRE_DEFAULT else dict(chosen)
            runs.append((label(name, with_wire), name, with_wire))
    return runs


def row_wire(options: dict) -> str:
    """The wire format of a row with ``options`` (:func:`method_runs`: fp32 where none)."""
    return options.get("wire", WIRE_DEFAULT)


def skipped(
    methods: list,
    teams: list,
    workers: int,
    sag: tuple = (SAG_DEFAULT,),
    layouts: tuple = (LAYOUT_DEFAULT,),
) -> list:
    """The notes (:func:`spardl_skip_reason`, each once) on the left-out SparDL settings.

    Those :func:`method_runs` leaves out at P = ``workers``.
    """
    if SPARDL not in methods:
        return []
    notes = (
        spardl_skip_reason(d, variant, workers, layout)
        for d in teams
        for variant in sag
        for layout in layouts
    )
    return list(dict.fromkeys(note for note in notes if note))
