"""Which rows a benchmark or simulation times: every method once, SparDL once per team count d,
Spar-Reduce-Scatter execution and Spar-All-Gather variant that applies at P workers.
"""

from __future__ import annotations

SRS_DEFAULT = "rounds"
SAG_DEFAULT = "bruck"


def spardl_label(teams: int, srs: str = SRS_DEFAULT, sag: str = SAG_DEFAULT) -> str:
    """A SparDL row's label: ``spardl``, with what differs from the defaults in parentheses:
    ``spardl(d=2)``, ``spardl(blocks)``, ``spardl(d=4,recursive)``, ``spardl(d=4,blocks,recursive)``.
    """
    parts = (
        ([f"d={teams}"] if teams > 1 else [])
        + ([srs] if srs != SRS_DEFAULT else [])
        + ([sag] if sag != SAG_DEFAULT else [])
    )
    return f"spardl({','.join(parts)})" if parts else "spardl"


def spardl_skip_reason(teams: int, sag: str, workers: int):
    """Why SparDL with ``teams`` and ``sag`` does not apply at P = ``workers``, as a note for
    stderr (``None``: it applies).
    """
    if workers % teams:
        return f"--teams {teams} skipped: a team count must divide P = {workers}"
    if sag == "recursive" and (teams == 1 or teams & (teams - 1)):
        return f"--sag recursive skipped at d={teams}: it needs a team count d > 1 that is a power of two"
    return None


def method_runs(
    methods: list,
    teams: list,
    workers: int,
    srs: tuple = (SRS_DEFAULT,),
    sag: tuple = (SAG_DEFAULT,),
) -> list:
    """``(label, name, options)`` for every row: each method once, spardl once per team count d,
    execution ``srs`` and variant ``sag`` that apply at P = ``workers`` (:func:`spardl_label`;
    :func:`skipped` says which do not).
    """
    runs = []
    for name in methods:
        if name != "spardl":
            runs.append((name, name, {}))
            continue
        for d in teams:
            for variant in sag:
                if spardl_skip_reason(d, variant, workers) is None:
                    runs += [
                        (
                            spardl_label(d, execution, variant),
                            name,
                            {"teams": d, "srs": execution, "sag": variant},
                        )
                        for execution in srs
                    ]
    return runs


def skipped(methods: list, teams: list, workers: int, sag: tuple = (SAG_DEFAULT,)) -> list:
    """The notes (:func:`spardl_skip_reason`, each once) on the SparDL settings that
    :func:`method_runs` leaves out at P = ``workers``.
    """
    if "spardl" not in methods:
        return []
    notes = (spardl_skip_reason(d, variant, workers) for d in teams for variant in sag)
    return list(dict.fromkeys(note for note in notes if note))
