"""Residuals that belong to parameters while synchronizers work on buckets of them.

A synchronizer keeps one error-feedback residual for the flat vector it averages. When the
vector is a bucket of parameters (a DDP bucket, a trainer's bucket), the residual of each
parameter must follow that parameter when the buckets are regrouped (DDP rebuilds them after
its first iteration, and again after a restart), and a checkpoint must give each parameter its
own residual back. :class:`ResidualStore` is that bookkeeping, in one place:

* a *layout* is one bucket's parameters, in order, and the synchronizer that serves it;
* each parameter's residual lives in exactly one place: a slice of its live layout's residual,
  or of a saved layout not built yet (after :meth:`ResidualStore.load_state_dict`);
* a new layout gathers its parameters' residuals from wherever they are (moving them, so that
  each counts once) and the largest dense warm-up count among them; layouts no parameter
  belongs to any more are dropped.

Parameters are known by a key the caller chooses (a name, or a number), the same in every run.
With momentum correction a parameter's velocity (``sync.velocity``) is per entry too, and
follows it in the same way (:data:`BUFFERS`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

__all__ = ["BUFFERS", "Layout", "layout_key", "ResidualStore"]

#: The per-entry buffers of a synchronizer that belong to parameters: the residual, and with
#: momentum correction the velocity (``None`` on synchronizers without it).
BUFFERS = ("residual", "velocity")


class Layout(NamedTuple):
    """One bucket layout: its parameters' keys and sizes, its synchronizer and result buffer."""

    keys: list
    sizes: list
    sync: object
    out: torch.Tensor


def layout_key(keys) -> str:
    """Return the name of the layout of parameters ``keys`` (in order): ``"3,4,5"``."""
    return ",".join(map(str, keys))


class ResidualStore:
    """Where each parameter's residual and dense warm-up count live, across bucket layouts.

    Not thread-safe: one thread at a time (the pipeline's communication thread, or the caller
    once the pipeline is idle).

    Attributes:
        layouts: live layouts by :func:`layout_key`.
    """

    def __init__(self) -> None:
        self.layouts: dict[str, Layout] = {}
        self._owner: dict = {}  # parameter key -> (layout key, offset, size) of a live layout
        self._saved: dict = {}  # layout key -> saved entry ({"numbers", "sizes", "state"})

    def layout(self, keys, sizes, build: Callable, device=None) -> Layout:
        """Return the live layout of parameters ``keys``, building it on first use.

        A new layout's synchronizer, ``build(numel)``, loads the saved state of the same layout
        if there is one, then takes each parameter's residual from where it lives and the
        largest dense warm-up count of the layouts its parameters come from.

        Args:
            keys: the parameters' keys, in bucket order.
            sizes: their numbers of entries.
            build: ``build(numel)`` returns a new synchronizer for ``numel`` entries.
            device: where the result buffer goes (default: the CPU).

        Returns:
            The :class:`Layout`.

        Raises:
            ValueError: a known residual does not fit its parameter's size (a state saved for
                another set of trainable parameters).
        """
        name = layout_key(keys)
        live = self.layouts.get(name)
        if live is not None:
            return live
        keys, sizes = list(keys), [int(size) for size in sizes]
        for key, size in zip(keys, sizes):
            for buffer in BUFFERS:
                slot = self._slot(key, buffer)
                if slot is not None and slot.numel() != size:
                    raise ValueError(
                        f"the loaded hook state holds {slot.numel()} {buffer} entries for "
                        f"parameter #{key}, which has {size}: it was saved for another "
                        "set of trainable parameters; start from a fresh state"
                    )
        sync = build(sum(sizes))
        saved = self._saved.pop(name, None)
        if saved is not None:
            sync.load_state_dict(saved["state"])
        # The dense warm-up count carries over from every layout these parameters come from.
        sync.calls = max(
            [sync.calls]
            + [self.layouts[owner].sync.calls for owner in self._owners_of(keys)]
            + [
                int(other["state"]["calls"])
                for other in self._saved.values()
                if not set(keys).isdisjoint(other["numbers"])
            ]
        )
        live = sync.feedback_state()
        for buffer in BUFFERS:
            target = getattr(live, buffer)
            if target is None:  # a velocity without momentum correction: none to take
                continue
            offset = 0
            for key, size in zip(keys, sizes):
                slot = self._slot(key, buffer)
                if slot is not None:  # moved, so that it counts once
                    target[offset : offset + size].copy_(slot)
                    slot.zero_()
                offset += size
        offset = 0
        for key, size in zip(keys, sizes):
            self._owner[key] = (name, offset, size)
            offset += size
        self.layouts[name] = Layout(keys, sizes, sync, torch.empty(sum(sizes), device=device))
        owning = {owner for owner, _, _ in self._owner.values()}
        for stale in [k for k in self.layouts if k not in owning]:  # replaced layouts
            del self.layouts[stale]
        return self.layouts[name]

    def _owners_of(self, keys) -> set:
        return {self._owner[key][0] for key in keys if key in self._owner}

    def _slot(self, key, buffer="residual"):
        """Return where parameter ``key``'s ``buffer`` lives, as a flat view; None if nowhere.

        ``buffer``: one of :data:`BUFFERS`.
        """
        if key in self._owner:
            name, offset, size = self._owner[key]
            live = getattr(self.layouts[name].sync.feedback_state(), buffer)
            return None if live is None else live[offset : offset + size]
        for saved in self._saved.values():
            if key in saved["numbers"]:
                at = saved["numbers"].index(key)
                offset = sum(saved["sizes"][:at])
                held = saved["state"].get(buffer)
                return None if held is None else held[offset : offset + saved["sizes"][at]]
        return None

    def residual(self, key):
        """Return parameter ``key``'s residual, a flat view of where it lives; None if nowhere."""
        return self._slot(key)

    def calls(self, key) -> int:
        """Return the synchronizer calls parameter ``key``'s residual has seen (0 if unknown)."""
        if key in self._owner:
            return self.layouts[self._owner[key][0]].sync.calls
        for saved in self._saved.values():
            if key in saved["numbers"]:
                return int(saved["state"]["calls"])
        return 0

    def keys(self) -> set:
        """Return the keys of every parameter whose residual the store holds."""
        return set(self._owner) | {k for saved in self._saved.values() for k in saved["numbers"]}

    def state_dict(self) -> dict:
        """Return every layout's synchronizer state by layout key, saved ones not built included.

        Each entry is ``{"numbers": keys, "sizes": sizes, "state": synchronizer state}``: the
        ``"buckets"`` of a ``SparDLState`` state.
        """
        buckets = dict(self._saved)
        for name, live in self.layouts.items():
            buckets[name] = {
                "numbers": list(live.keys),
                "sizes": list(live.sizes),
                "state": live.sync.state_dict(),
            }
        return buckets

    def load_state_dict(self, buckets: dict) -> None:
        """Replace everything by ``buckets`` (a :meth:`state_dict`); layouts pick them up later.

        Raises:
            ValueError: an entry lacks its keys, sizes or residual, or its residual's length
                is not the sum of its sizes.
        """
        saved = {}
        for name, entry in buckets.items():
            try:
                numbers, sizes = list(entry["numbers"]), [int(s) for s in entry["sizes"]]
                residual = entry["state"]["residual"]
            except (KeyError, TypeError):
                raise ValueError(f"saved bucket {name!r} is not a bucket state") from None
            if residual.numel() != sum(sizes) or len(numbers) != len(sizes):
                raise ValueError(
                    f"saved bucket {name!r}: {residual.numel()} residual entries for "
                    f"{len(numbers)} parameters of {sum(sizes)}"
                )
            state = dict(entry["state"], residual=residual.clone())
            if isinstance(state.get("velocity"), torch.Tensor):
                state["velocity"] = state["velocity"].clone()
            saved[name] = {"numbers": numbers, "sizes": sizes, "state": state}
        self._saved = saved
        self.layouts.clear()
        self._owner.clear()
