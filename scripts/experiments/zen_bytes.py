"""Bytes per rank and call of zen, topk and spardl on the in-process group: docs/DEVIATIONS.md's
table of ZEN's bytes (runs/deviations/zen_bytes.json).

    .venv/bin/python scripts/experiments/zen_bytes.py > runs/deviations/zen_bytes.json

The benchmark's seeded heavy-tailed gradients (seed 0), n = 1,000,000, density 0.01, fp32, three
calls with residuals carried; bytes are the mean over the ranks of calls 2 and 3. Byte counts do
not depend on the machine.
"""

import json
import sys

import compressors
from allreducers.transports import local_group
from syncbench.gradients import SyntheticGradients

NUMEL, DENSITY = 1_000_000, 0.01


def stats_per_call(method: str, workers: int) -> list:
    """Every rank's stats (without timings) after each of three calls."""
    source = SyntheticGradients(NUMEL, 0)

    def body(transport):
        sync = compressors.create(method, transport, numel=NUMEL, density=DENSITY)
        stats = []
        for call in range(3):
            sync.allreduce(source.get(transport.rank, call).clone())
            stats.append({k: v for k, v in sync.stats.items() if k != "seconds"})
        return stats

    return local_group(workers).run(body)


def main() -> None:
    rows = []
    for workers in (4, 8):
        for method in ("zen", "topk", "spardl"):
            per_rank = stats_per_call(method, workers)
            sent = [sum(r[c]["bytes_sent"] for r in per_rank) / workers for c in range(3)]
            last = per_rank[0][2]
            rows.append(
                {
                    "method": method,
                    "workers": workers,
                    "numel": NUMEL,
                    "density": DENSITY,
                    "wire": "fp32",
                    "bytes_per_rank_calls_2_3": (sent[1] + sent[2]) / 2,
                    "rounds": last["rounds"],
                    "bitmaps": last.get("bitmaps"),
                    "union": last.get("union"),
                }
            )
    json.dump(rows, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
