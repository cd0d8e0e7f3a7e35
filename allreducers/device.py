"""Host integers on a device without waiting for it: the one copy every layer shares."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["device_tensor"]


def device_tensor(values: Sequence[int], dtype: torch.dtype, device: torch.device):
    """Return host integers as a tensor on ``device``, without waiting for it.

    On a GPU the copy starts from pinned memory (PyTorch's caching host allocator keeps the
    block until the copy is done): a plain copy from pageable memory synchronizes the stream.
    """
    host = torch.tensor(list(values), dtype=dtype)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
