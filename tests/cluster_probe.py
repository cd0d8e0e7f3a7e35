"""Where each rank runs, and how fast rank 0 reaches each other one: for cluster_network.sh.

Run under ``mpiexec``; rank 0 prints one line of JSON::

    {"ranks": [{"rank": 0, "netns": 4026532246, "hostname": "host0", "processor": "host0",
                "address": "169.254.77.1", "local_size": "2"}, ...],
     "seconds": [null, 0.001, 0.83, ...], "bytes": 2000000, "cluster": "{...}",
     "network": "20mbit"}

``netns`` is the inode of the rank's network namespace, ``address`` the one it would reach the
switch (169.254.77.254) from (a UDP socket's connect sends nothing), ``local_size`` Hydra's
``MPI_LOCALNRANKS``. ``seconds[r]``: rank 0 sends ``sys.argv[1]`` bytes (default 2,000,000) to
rank r, after a 1 kB exchange that opens the connection, and r acknowledges with one byte.
``cluster`` and ``network``: rank 0's ``SPARDL_CLUSTER`` and ``SPARDL_NETWORK_RATE``.
"""

import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI


def address():
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("169.254.77.254", 9))
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def timed_send(comm, payload, peer):
    """Rank 0 sends ``payload`` to ``peer``; return the seconds on rank 0 (None elsewhere)."""
    rank = comm.Get_rank()
    comm.Barrier()
    started = time.perf_counter()
    if rank == 0:
        comm.Send(payload, dest=peer)
        comm.Recv(payload[:1], source=peer)
        return time.perf_counter() - started
    if rank == peer:
        comm.Recv(payload, source=0)
        comm.Send(payload[:1], dest=0)
    return None


def main():
    comm = MPI.COMM_WORLD
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    me = {
        "rank": comm.Get_rank(),
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "hostname": socket.gethostname(),
        "processor": MPI.Get_processor_name(),
        "address": address(),
        "local_size": os.environ.get("MPI_LOCALNRANKS"),
    }
    ranks = comm.gather(me)
    payload = np.zeros(size, dtype=np.uint8)
    seconds = [None]
    for peer in range(1, comm.Get_size()):
        timed_send(comm, payload[:1000], peer)
        seconds.append(timed_send(comm, payload, peer))
    if comm.Get_rank() == 0:
        cluster, network = os.environ.get("SPARDL_CLUSTER"), os.environ.get("SPARDL_NETWORK_RATE")
        report = {"ranks": ranks, "seconds": seconds, "bytes": size}
        print(json.dumps(dict(report, cluster=cluster, network=network)), flush=True)


if __name__ == "__main__":
    main()
