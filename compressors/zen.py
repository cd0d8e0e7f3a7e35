"""``zen``: local top-k, hash-partitioned push to owners, bitmap- or COO-indexed pull.

ZEN (Wang et al., OSDI'25, arXiv 2309.13254) on our selection and error feedback. One
synchronization of worker w among P:

1. a = grad + residual; S_w = the k = max(1, int(n * density)) largest |a|, taken out of a
   (``Selector.take``, as ``topk``); the new residual is a with S_w zeroed.
2. Partition by hash: index i belongs to owner r = ``hash_owner(i, P)``
   (:mod:`allreducers.hashing`: a fixed 32-bit mix scaled into P equal blocks, the same on
   every rank and call, whatever n). S_w is split by owner, each part in ascending order.
3. Push (P - 1 rounds, ``rotation_schedule``): in round s worker w sends its part owned by
   w + s (mod P) to it and receives its own part from w - s. One list per message, no count
   (the length tells); about 2k(P-1)/P words per worker.
4. Aggregate: owner r adds the P parts it holds in rank order 0, 1, ..., P-1 (float32), giving
   the sums s over U_r, the union of the indices it received (ascending). Nothing is selected
   again: every pushed value arrives in the sum.
5. Pull (ceil(log2 P) rounds, Bruck all-gather of the P partitions): owner r encodes
   (U_r, s) once, by the wire's ``allreducers.wire.PartitionCodec``, as a header
   ``[form, count, bytes]`` and a body of int32 words, padded to whole words; a message carries
   the headers of its partitions first, then their bodies (one read of the headers per step).
   A list (COO, form 0) is the codec's one-list message of (U_r, s): 2 words an entry at fp32.
   A bitmap (form 1) is ceil(|L_r| / 32) words over L_r, the indices of [0, n) that r owns in
   ascending order (bit j set where L_r[j] is in U_r), then the codec's values of s. With
   ``pull_index="auto"`` an owner sends the bitmap exactly when its bytes are fewer than the
   list's (at fp32: ceil(|L_r| / 32) < |U_r|, an aggregated density above about 1/32); the bit
   marks presence, so a sum that cancels to 0.0 is sent like any other. Partitions are
   forwarded as they are. About (P-1)/P * (U + n/32) words per worker with bitmaps, 2U(P-1)/P
   with lists, U = sum_r |U_r| between k and min(n, P k).
6. result = s / P at U_r for every r (every rank, owner included, divides the owner's sums):
   the same bits on every rank, U entries present. Nothing is lost: sum_w a_w = P * result +
   sum_w residual_w.

At a 16-bit wire (docs/DESIGN.md, section "The wire") each pushed part is quantized as the
receiver decodes it and its sender keeps v - q(v) in its residual; an owner quantizes its sums
and keeps s - q(s); the part an owner keeps for itself does not travel and is not quantized.
A list then takes the codec's 16-bit index offsets where they fit, and "auto" compares those
bytes with the bitmap's.
Where this differs from the paper: docs/DEVIATIONS.md, section "ZEN".
"""

from __future__ import annotations

import torch

from allreducers import (
    bruck_allgather_schedule,
    check_choice,
    index_add_in_order,
    rotation_schedule,
    run_schedule,
)
from allreducers.hashing import hash_owner, partition_lists
from allreducers.wire import (
    BITMAP,
    COO,
    PARTITION_INDEX,
    PartitionCodec,
    bitmap_padded,
    pack_bits,
    unpack_bits,
)

from .base import Synchronizer
from .registry import register
from .selection import Selector
from .sparse_ops import budget, put_

#: The partitions' forms, and the wire's bitmap of bits (re-exported: ``allreducers.wire``).
__all__ = ["Zen", "COO", "BITMAP", "pack_bits", "unpack_bits"]


def _span(counts: list, index: int) -> slice:
    """Return the slice of part ``index`` in a tensor of parts of sizes ``counts``, in order."""
    start = sum(counts[:index])
    return slice(start, start + counts[index])


@register("zen", description="ZEN: top-k, hash-partitioned push to owners, bitmap-indexed pull")
class Zen(Synchronizer):
    """Local top-k pushed to hash-chosen owners, summed there, pulled back with bitmap indices.

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries each worker selects, in (0, 1].
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.
        pull_index: how a pulled partition's indices travel: ``"auto"`` (default: per partition
            and call the smaller of bitmap and list), ``"bitmap"`` or ``"coo"`` (always).

    Raises:
        ValueError: an invalid option (``pull_index`` names its valid values).
    """

    adds_residual = True  # the selection pass adds the residual (Selector.scan)
    choices = {"pull_index": PARTITION_INDEX}

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        dense_warmup: int = 0,
        wire: str = "fp32",
        pull_index: str = "auto",
    ) -> None:
        check_choice("pull_index", pull_index, self.choices["pull_index"])
        super().__init__(comm, numel, density, dense_warmup, wire)
        self.pull_index = pull_index
        self.partitions = PartitionCodec(self.codec, pull_index, span=numel)
        self.k = budget(numel, self.density)
        members = list(range(self.size))
        self.push_steps = rotation_schedule(self.rank, members)
        self.pull_steps = bruck_allgather_schedule(self.rank, members)
        self.selector = Selector()
        self._lists: dict = {}  # device -> L_0 .. L_(P-1) there
        self._nnz = self._bitmaps = 0
        self._counts: dict = {}

    def owned(self, device: torch.device) -> tuple:
        """Return L_0, ..., L_(P-1) (int32, ascending) on ``device``, cached."""
        key = str(device)
        if key not in self._lists:
            lists = partition_lists(self.numel, self.size)
            self._lists[key] = tuple(part.to(device) for part in lists)
        return self._lists[key]

    def _synchronize(self, grad, timer):
        accumulated = self._residual
        size, device = self.size, accumulated.device
        compact = self.codec.compact and size > 1
        self._bitmaps = 0
        with timer("select"):
            chosen, values = self.selector.take(accumulated, self.k, addend=grad, key="accumulated")
            chosen, values, counts = self._sort_by_owner(chosen, values)
            messages = []
            if size > 1:
                sent, messages = self.codec.quantize_encode_parts(
                    chosen, values, counts, self.rank, self.numel
                )
                if compact:
                    put_(accumulated, chosen, values - sent)  # the wire's loss (own part: 0)
        own = _span(counts, self.rank)
        held = self._push(messages, device, timer)
        with timer("accumulate"):
            result = self._new_result(device)
            # The parts in rank order (the own part as it is): the same float32 sums anywhere.
            items = [(chosen[own], values[own]) if s == self.rank else held[s] for s in range(size)]
            everything, summands, sizes = self.codec.decode_joined(items, self.numel)
            everything = everything.long()
            index_add_in_order(result, everything, summands, sizes)
            union = torch.unique(everything)
            sums = result.index_select(0, union)
            if compact:
                sent = self.codec.quantize_row(sums)
                accumulated.index_add_(0, union, sums - sent)  # the owner keeps s - q(s)
                sums = sent
            partitions = {self.rank: (union, sums)}
            if size > 1:
                mine = self.partitions.encode(self.owned(device)[self.rank], union, sums)
                self._bitmaps += mine.form == BITMAP
        if size > 1:
            partitions.update(self._pull(mine, device, timer))
        with timer("accumulate"):
            indices = torch.cat([part[0].long() for part in partitions.values()])
            averages = torch.cat([part[1] for part in partitions.values()]) / size
            put_(result, indices, averages)
        self._nnz = averages
        self._counts = {"union": indices.numel(), "bitmaps": self._bitmaps}
        return result, accumulated

    def _sort_by_owner(self, chosen: torch.Tensor, values: torch.Tensor) -> tuple:
        """Return this rank's selection ordered by owner, and the P owners' counts.

        Within an owner the entries stay ascending. One host read: the counts, which size the
        messages.
        """
        if self.size == 1:
            return chosen, values, [chosen.numel()]
        owners = hash_owner(chosen, self.size)
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=self.size).tolist()
        return chosen.index_select(0, order), values.index_select(0, order), counts

    def _push(self, messages: list, device: torch.device, timer) -> dict:
        """Send each owner its message (rotation); return {source: message received}."""
        held = {}

        def consume(step, message):
            held[step.recv_from] = message

        run_schedule(
            self.transport,
            self.push_steps,
            lambda step: messages[step.send_items[0]],
            consume,
            device,
            timer,
            dtype=self.codec.recv_dtype,
        )
        return held

    def _decode(self, held: dict) -> dict:
        """Return the other owners' partitions ``held`` as ``{key: (indices, sums)}``.

        The lists are decoded together (key ``"listed"``), and so are all bitmaps (key
        ``"bitmaps"``): one read of their set bits for the call.

        Raises:
            RuntimeError: a partition does not fit its header.
        """
        device = next(iter(held.values())).body.device
        others = {owner: part for owner, part in held.items() if owner != self.rank}
        bitmaps = {owner: part for owner, part in others.items() if part.form == BITMAP}
        listed = {owner: part for owner, part in others.items() if part.form != BITMAP}
        self._bitmaps += len(bitmaps)
        partitions = {}
        if listed:
            partitions["listed"] = self.partitions.decode_lists(listed)
        if bitmaps:
            owned = self.owned(device)
            partitions["bitmaps"] = self.partitions.decode_bitmaps(
                bitmaps,
                [owned[owner].numel() for owner in bitmaps],
                self.joined_owned(device, tuple(bitmaps)),
            )
        return partitions

    def joined_owned(self, device: torch.device, owners: tuple) -> torch.Tensor:
        """Return the padded L_r of ``owners`` joined (:meth:`padded_owned`).

        Kept for the last set of owners asked for, usually the same call after call: a copy of
        about n entries saved per call.
        """
        key = ("joined", str(device))
        kept = self._lists.get(key)
        if kept is None or kept[0] != owners:
            padded = self.padded_owned(device)
            kept = self._lists[key] = (owners, torch.cat([padded[owner] for owner in owners]))
        return kept[1]

    def padded_owned(self, device: torch.device) -> tuple:
        """Return L_0, ..., L_(P-1), each padded with zeros to whole bitmap words, cached."""
        key = ("padded", str(device))
        if key not in self._lists:
            self._lists[key] = tuple(bitmap_padded(part) for part in self.owned(device))
        return self._lists[key]

    def _pull(self, mine, device: torch.device, timer) -> dict:
        """All-gather the owners' partitions (Bruck); return {key: (indices, sums)} of others.

        ``mine``: this rank's encoded partition. A message is the wire's join of its
        partitions (``allreducers.wire.PartitionCodec``): one read of the headers per step.
        """
        held = {self.rank: mine}

        def produce(step):
            return self.partitions.join([held[item] for item in step.send_items], device)

        def consume(step, message):
            parts = self.partitions.split(message, len(step.recv_items))
            held.update(zip(step.recv_items, parts))

        run_schedule(
            self.transport,
            self.pull_steps,
            produce,
            consume,
            device,
            timer,
            dtype=self.partitions.recv_dtype,
        )
        with timer("accumulate"):
            return self._decode(held)

    def _count_nonzero(self, result):
        """The non-zeros of the call's U entries, counted only if ``count_nnz``."""
        return torch.count_nonzero(self._nnz) if self.count_nnz else None

    def _after_call(self) -> None:
        if self.calls > self.dense_warmup:
            self._stats.update(self._counts)

    def _config(self) -> dict:
        return {**super()._config(), "partition": "hash32"}
