"""A plain-NumPy reference of ZEN (fp32 wire), written from the method's description.

Per rank the top-k of a = grad + residual (ties to the lower index); each index to the owner
its 32-bit hash names; each owner sums what it receives in rank order (float32); every rank
gets sum / P at the union of the selected indices. Also each owner's index form (bitmap or
list) and the bytes every rank sends: its parts for the other owners (8 bytes an entry), then
the partitions it passes on in the Bruck all-gather (3 header words, the index words, a word
per value).
"""

import numpy as np

MIX = np.uint64(0x45D9F3B)
MASK = np.uint64(0xFFFFFFFF)
COO, BITMAP = 0, 1


def budget(numel, density):
    return min(numel, max(1, int(numel * density)))


def top(values, k):
    """Indices (ascending) of the k largest |values|, ties to the lower index."""
    order = np.lexsort((np.arange(len(values)), -np.abs(values)))
    return np.sort(order[:k])


def owner(indices, workers):
    """The owner of each index: Mueller's 32-bit hash, scaled into ``workers`` equal blocks."""
    x = np.asarray(indices, dtype=np.uint64) & MASK
    x = (((x >> np.uint64(16)) ^ x) * MIX) & MASK
    x = (((x >> np.uint64(16)) ^ x) * MIX) & MASK
    x = (x >> np.uint64(16)) ^ x
    return ((x * np.uint64(workers)) >> np.uint64(32)).astype(np.int64)


def bruck_sends(rank, workers):
    """The partitions ``rank`` sends in each step of the Bruck all-gather."""
    sends, distance = [], 1
    while distance < workers:
        count = min(distance, workers - distance)
        sends.append([(rank + i) % workers for i in range(count)])
        distance *= 2
    return sends


def reference_zen(acc, density, pull_index="auto"):
    """One ZEN call on the (P, n) float32 ``acc`` = grad + residual of every rank.

    Returns:
        A dict: ``result`` (n,), ``residual`` (P, n), ``forms`` (per owner, BITMAP or COO;
        empty at P = 1), ``union`` (per owner, its sorted indices), ``bytes`` (per rank).
    """
    workers, n = acc.shape
    k = budget(n, density)
    owners_of_all = owner(np.arange(n), workers)
    owned = [np.flatnonzero(owners_of_all == r) for r in range(workers)]
    chosen = [top(acc[w], k) for w in range(workers)]
    residual = acc.copy()
    sums = np.zeros(n, np.float32)
    for w in range(workers):  # rank order, in float32
        sums[chosen[w]] += acc[w, chosen[w]]
        residual[w, chosen[w]] = 0
    union = [
        np.unique(np.concatenate([c[owner(c, workers) == r] for c in chosen]))
        for r in range(workers)
    ]
    result = np.zeros(n, np.float32)
    for r in range(workers):
        result[union[r]] = sums[union[r]] / np.float32(workers)
    forms, words = [], []
    for r in range(workers):
        bitmap = (len(owned[r]) + 31) // 32
        if pull_index == "bitmap" or pull_index == "auto" and bitmap < len(union[r]):
            forms.append(BITMAP)
            words.append(3 + bitmap + len(union[r]))
        else:
            forms.append(COO)
            words.append(3 + 2 * len(union[r]))
    sent = []
    for w in range(workers):
        if workers == 1:
            sent.append(0)
            continue
        pushed = int((owner(chosen[w], workers) != w).sum())
        pulled = sum(words[r] for step in bruck_sends(w, workers) for r in step)
        sent.append(8 * pushed + 4 * pulled)
    return {
        "result": result,
        "residual": residual,
        "forms": forms if workers > 1 else [],
        "union": union,
        "bytes": sent,
    }
