"""Data loaders of one rank: its shuffled training shard and its part of the test set."""

from torch.utils.data import DataLoader, Subset

from trainer.sampler import ShardedSampler, evaluation_shard


def make_loaders(split, batch_size, eval_batch_size, rank, world_size, seed, workers, device):
    """Return (train loader, test loader) of rank ``rank`` for the ``DataSplit`` ``split``.

    The training loader's sampler is a ``ShardedSampler``: call ``loader.sampler.set_epoch``
    before each epoch. A data set with a ``collate`` method (the text ones: padding, masking)
    forms its own batches.
    """
    sampler = ShardedSampler(len(split.train), rank, world_size, seed=seed)
    pin = device.type == "cuda"
    # Workers start anew every epoch (not persistent): each epoch's augmentation seeds then come
    # from the main process's generator, which checkpoints restore, so a resumed run draws what
    # an uninterrupted one would.
    train = DataLoader(
        split.train,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        drop_last=_drops_single_last(len(sampler), batch_size),
        collate_fn=getattr(split.train, "collate", None),
    )
    test_part = Subset(split.test, evaluation_shard(len(split.test), rank, world_size))
    test = DataLoader(
        test_part,
        batch_size=eval_batch_size,
        num_workers=workers,
        pin_memory=pin,
        collate_fn=getattr(split.test, "collate", None),
    )
    return train, test


def smallest_training_batch(num_samples, world_size, batch_size):
    """The fewest samples a training batch holds when ``num_samples`` are sharded over
    ``world_size`` ranks (the same on every rank: the shards have equal sizes)."""
    shard = len(ShardedSampler(num_samples, 0, world_size))
    last = shard % batch_size
    return last if last and not _drops_single_last(shard, batch_size) else batch_size


def _drops_single_last(shard, batch_size):
    """Whether a shard's last batch of one sample is dropped: only after full batches (batch norm
    cannot train on one value per channel; the shards are reshuffled every epoch, so it is another
    sample each time). A shard of one sample keeps it: an epoch is never empty."""
    return 1 < batch_size < shard and shard % batch_size == 1
