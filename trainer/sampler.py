"""Which samples each rank reads: shuffled equal shards for training, disjoint ones for testing."""

import math

import torch
from torch.utils.data import Sampler


class ShardedSampler(Sampler):
    """Rank ``rank``'s shard of a per-epoch permutation of ``num_samples`` indices.

    Every epoch the permutation is drawn from ``seed + epoch`` (call ``set_epoch``), the same on
    all ranks; it is padded by wrapping around to a multiple of ``world_size`` so every rank gets
    ``ceil(num_samples / world_size)`` indices and runs the same number of iterations (each
    iteration is a collective). Rank r takes positions r, r + world_size, ... (from ``start`` on,
    ``set_epoch``).
    """

    def __init__(self, num_samples, rank, world_size, seed=0, shuffle=True):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of {world_size}")
        if num_samples < 1:
            raise ValueError("cannot shard an empty data set")
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch, start=0):
        """Select the permutation of ``epoch``, from its ``start``-th sample on (a run resumed
        within the epoch, perhaps by another number of ranks, goes on where it stood)."""
        self.epoch, self.start = epoch, int(start)

    def __len__(self):
        # Every rank the same count (each iteration is a collective): those all ranks have.
        return (math.ceil(self.num_samples / self.world_size) * self.world_size - self.start) // (
            self.world_size
        )

    def __iter__(self):
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        total = math.ceil(self.num_samples / self.world_size) * self.world_size
        padded = order[torch.arange(total) % self.num_samples]
        return iter(padded[self.start + self.rank :: self.world_size][: len(self)].tolist())


def evaluation_shard(num_samples, rank, world_size):
    """Indices rank ``rank`` evaluates: every sample exactly once over all ranks, no padding."""
    return list(range(rank, num_samples, world_size))
