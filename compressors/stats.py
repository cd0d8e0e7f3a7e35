"""One statistics record for a synchronization: one call's, or the sum of several.

A synchronizer's ``stats`` after a call, a bucket of the DDP hook's pipeline, a step's buckets
(``BucketPipeline.take_stats``) and an FSDP step's shards (the trainer's ``--fsdp``) are all
records of this one shape:

- ``bytes_sent``, ``messages``, ``rounds``, ``host_syncs``: the traffic this rank generated
  (``allreducers.transports.Traffic``);
- ``nnz``: the non-zeros of the result (``None`` where not counted);
- ``seconds``: seconds per phase (``select``, ``comm``, ``accumulate``, ``total``);
- a sum of records adds ``parts``, the records it sums, and may add fields of its own (the
  pipeline's ``thread_seconds`` and ``cpu_seconds``).

    >>> one = call_record({"bytes_sent": 8, "messages": 1, "rounds": 1, "host_syncs": 0}, 2,
    ...                   {"comm": 0.5, "total": 0.75})
    >>> summed([one, one])["bytes_sent"], summed([one, one])["seconds"]["total"]
    (16, 1.5)
"""

from __future__ import annotations

__all__ = ["COUNTS", "PHASES", "call_record", "summed"]

#: The traffic counters of a record.
COUNTS = ("bytes_sent", "messages", "rounds", "host_syncs")

#: The phases every record's ``seconds`` holds (a sum adds ``total`` where its parts have it).
PHASES = ("select", "comm", "accumulate")


def call_record(counts: dict, nnz: int | None, seconds: dict) -> dict:
    """Return one call's record: the ``counts`` of :data:`COUNTS`, ``nnz`` and ``seconds``.

    ``seconds``: per phase; the phases of :data:`PHASES` it lacks are 0.
    """
    return {
        **{key: counts.get(key, 0) for key in COUNTS},
        "nnz": nnz,
        "seconds": {**dict.fromkeys(PHASES, 0.0), **seconds},
    }


def summed(parts: list, **fields) -> dict:
    """Return the record of the calls ``parts`` (records): their counts and phases summed.

    ``nnz`` is the sum where every part counted it, else ``None``; ``parts`` the list itself;
    ``fields`` are added as they are.
    """
    seconds = dict.fromkeys(PHASES, 0.0)
    for part in parts:
        for phase, value in part["seconds"].items():
            seconds[phase] = seconds.get(phase, 0.0) + value
    nnzs = [part["nnz"] for part in parts]
    return {
        **{key: sum(part[key] for part in parts) for key in COUNTS},
        "nnz": None if any(n is None for n in nnzs) else sum(nnzs),
        "seconds": seconds,
        "parts": parts,
        **fields,
    }
