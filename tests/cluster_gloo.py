"""Where each torchrun worker runs, over Gloo: for scripts/cluster_network.sh's torchrun mode.

Rank 0 prints one line of JSON, ``{"ranks": [{"rank", "netns", "hostname", "local_rank",
"world_size"}, ...], "seconds": S, "bytes": B}``: ``S`` the seconds rank 0 takes to send
``sys.argv[1]`` bytes (default 1,000,000) to the last rank, after a small warm-up send.
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    me = {
        "rank": rank,
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "hostname": socket.gethostname(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": world,
    }
    ranks = [None] * world
    dist.all_gather_object(ranks, me)
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    last = world - 1
    seconds = None
    for payload in (torch.zeros(250, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8)):
        dist.barrier()
        started = time.perf_counter()
        if rank == 0:
            dist.send(payload, last)
            dist.recv(payload[:1], last)
        elif rank == last:
            dist.recv(payload, 0)
            dist.send(payload[:1], 0)
        seconds = time.perf_counter() - started
    if rank == 0:
        print(json.dumps({"ranks": ranks, "seconds": seconds, "bytes": size}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
