"""One small collective at the first call: every rank must have built the same synchronizer.

Fixed message sizes follow from the configuration, so ranks with different settings would
exchange messages of different sizes: at best an abort deep inside a call, at worst results of
different lengths on different ranks. :func:`check_agreement` compares the settings of all ranks
in one all-reduce of P x S numbers and raises the same ``ValueError`` on every rank, naming the
setting and the ranks that differ. ``compressors.create`` records the settings and the first
``allreduce`` (or SparDL's ``choose``) compares them, so creating a synchronizer stays local.
"""

from __future__ import annotations

import numbers
import zlib

import torch

__all__ = ["normal_value", "settings", "check_agreement"]


def normal_value(value):
    """``value`` with NumPy's and Python's numbers alike (``np.int64(3)`` is ``3``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def _fingerprint(value) -> float:
    """A number (exact in float64) that equal settings share: 1 + CRC-32 of the value's repr."""
    return float(1 + zlib.crc32(repr(normal_value(value)).encode()))


def settings(name: str, numel, density, options: dict) -> dict:
    """Return what every rank must share for a synchronizer: method, numel, density, options."""
    return {
        "method": name,
        "numel": numel,
        "density": density,
        "options": sorted((key, normal_value(value)) for key, value in options.items()),
    }


def check_agreement(transport, settings: dict) -> None:
    """Raise ``ValueError`` on every rank unless all ranks pass equal ``settings``.

    A collective over ``transport`` (nothing on one rank, nor on transports that replay a
    recorded call: ``capabilities.checks_agreement`` false). ``settings`` maps names to values;
    every rank must pass the same names in the same order (the method's option names may differ:
    they go into one entry, ``options``).
    """
    size = transport.size
    if size == 1 or not transport.capabilities.checks_agreement:
        return
    names = list(settings)
    device = transport.agreement_device()
    table = torch.zeros(size, len(names), dtype=torch.float64, device=device)
    table[transport.rank] = torch.tensor([_fingerprint(settings[name]) for name in names])
    table = transport.allreduce_sum_(table).cpu()
    for column, name in enumerate(names):
        values = table[:, column].tolist()
        if len(set(values)) == 1:
            continue
        groups: dict = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        mine = groups[values[transport.rank]]
        others = sorted(set(range(size)) - set(mine))
        holders = f"rank {mine[0]} has" if len(mine) == 1 else f"ranks {_ranks(mine)} have"
        raise ValueError(
            f"the ranks do not agree on {name}: {holders} "
            f"{name}={normal_value(settings[name])!r}; ranks {_ranks(others)} differ. Every rank "
            "must create the synchronizer with the same method, numel, density and options"
        )


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks))
