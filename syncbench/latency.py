"""The per-message cost of a network as the synchronizers see it.

P ranks exchange small messages in rounds, each rank sending one to its right neighbour and
receiving one from its left (as a round of SparDL's reduce-scatter does), through the project's MPI
transport.

    RUN=".venv/bin/mpiexec -n 2 .venv/bin/python -m syncbench.latency"
    $RUN
    scripts/shaped_network.sh --rate 1gbit -- $RUN

The median seconds per round is the ``alpha`` of the simulator's ``shared:RATE`` networks
(``scripts/simulate.py --message-cost``). Run it with no more ranks than cores: with more ranks,
a round also waits for descheduled receivers (milliseconds, not microseconds), which the
simulator's local-work term already prices through the ranks' share of the cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from allreducers.transports import Incoming, Outgoing

__all__ = ["round_seconds", "main"]


def round_seconds(transport, rounds: int, numel: int = 2) -> list:
    """Seconds of each of ``rounds`` exchange rounds of ``numel`` int32 entries.

    Timed on this rank; the rounds start together after a barrier every 10 rounds.
    """
    message = torch.zeros(numel, dtype=torch.int32)
    right, left = (transport.rank + 1) % transport.size, (transport.rank - 1) % transport.size
    seconds = []
    for number in range(rounds):
        if number % 10 == 0:
            transport.barrier()
        start = time.perf_counter()
        sends, posted = transport.start_round(
            Outgoing(message, right, number), Incoming(left, number, torch.int32, message.device)
        )
        transport.wait_recv(posted)
        transport.waitall(sends)
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> float:
    """Measure under mpiexec.

    Print the median and quartiles of the slowest rank's round times on rank 0 and return the median
    (on every rank).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=2000, help="timed rounds (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=200, help="untimed rounds first (default: %(default)s)"
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the result to FILE (rank 0): network, workers, median_s, q1_s, q3_s, "
        "rounds and the UTC time it was measured",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    from mpi4py import MPI

    from allreducers.transports.mpi import MPITransport
    from allreducers.transports.placement import place_rank

    from .bench import network_label

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        parser.error("run it under mpiexec with at least 2 ranks")
    place_rank(comm, "cpu")
    transport = MPITransport(comm)
    round_seconds(transport, args.warmup)
    mine = torch.tensor(round_seconds(transport, args.rounds), dtype=torch.float64)
    slowest = mine.clone()
    comm.Allreduce(MPI.IN_PLACE, slowest.numpy(), op=MPI.MAX)
    q1, median, q3 = statistics.quantiles(slowest.tolist(), n=4)
    if comm.Get_rank() == 0:
        print(
            f"per-message cost on {network_label()} at P = {comm.Get_size()}: "
            f"median {median * 1e6:.1f} us "
            f"per round (quartiles {q1 * 1e6:.1f}-{q3 * 1e6:.1f} us, slowest rank of each of "
            f"{args.rounds} rounds); use it as simulate.py --message-cost {median:.3g}"
        )
        if args.json:
            row = {
                "network": network_label(),
                "workers": comm.Get_size(),
                "median_s": median,
                "q1_s": q1,
                "q3_s": q3,
                "rounds": args.rounds,
                "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            with open(args.json, "w") as stream:
                json.dump(row, stream, indent=1)
    return median


if __name__ == "__main__":
    main()
