"""One synchronizer's error-feedback state: what it carries from call to call.

:class:`FeedbackState` holds it: the residual e (what this rank still owes the average), momentum
correction's velocity u, the call count, the method's extras (Ok-Topk's thresholds and regions,
SparDL's adaptive h) and the dtype the residual is kept in (float32, or bfloat16 where FSDP's
``residual_dtype="bf16"`` keeps it). A synchronizer hands out its live state with
``feedback_state()`` and takes one in with ``load_feedback(state, parts)``; nothing else touches
its buffers. The density warm-up lends its residual to a stage's synchronizer that way, FSDP's
bf16 slots keep one :class:`FeedbackState` each, and ``state_dict()`` writes one out.

A state dict is flat (``calls``, ``residual``, ``velocity``, the extras' own keys, ``dtype``)
and carries :data:`STATE_VERSION`: version 1 (written before this module, with no ``version``
key) has the same keys less ``dtype`` and loads as it is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

__all__ = ["STATE_VERSION", "DTYPES", "PARTS", "COMMON_KEYS", "FeedbackState"]

#: The format of a synchronizer's ``state_dict`` (1: before it carried a version).
STATE_VERSION = 2
#: The dtypes a residual is kept in, by name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: What :meth:`FeedbackState.copy_` and ``load_feedback`` can take over, all by default.
PARTS = ("residual", "velocity", "calls", "extra")
#: The keys of a synchronizer's state dict that are not its method's extras.
COMMON_KEYS = ("version", "method", "numel", "config", "calls", "residual", "velocity", "dtype")


@dataclass
class FeedbackState:
    """Residual, velocity, call count, the method's extras, and the residual's dtype.

    Attributes:
        residual: this rank's residual e, 1-D (in ``dtype``).
        velocity: momentum correction's u (float32), or ``None`` without it.
        calls: the synchronizer's calls so far, dense warm-up calls included.
        extra: the method's own state (plain values), ``{}`` where it has none or where it is
            to be re-derived (a state resharded to another world size).
        dtype: ``"fp32"`` or ``"bf16"``, the residual's (:data:`DTYPES`).
    """

    residual: torch.Tensor
    velocity: torch.Tensor | None = None
    calls: int = 0
    extra: dict = field(default_factory=dict)
    dtype: str = "fp32"

    @classmethod
    def zeros(cls, numel: int, momentum: bool = False, dtype: str = "fp32", extra=None):
        """A state of ``numel`` entries that owes nothing (a synchronizer never called)."""
        return cls(
            residual=torch.zeros(numel, dtype=DTYPES[dtype]),
            velocity=torch.zeros(numel) if momentum else None,
            extra=copy.deepcopy(extra or {}),
            dtype=dtype,
        )

    @property
    def numel(self) -> int:
        """The residual's length."""
        return self.residual.numel()

    def copy_(self, other: FeedbackState, parts=PARTS) -> FeedbackState:
        """Take ``parts`` of ``other`` over, in place (converting dtype and device); return self.

        A velocity is copied only where this state keeps one: from a state without one it is
        zeroed (momentum correction starts from u = 0).
        """
        if "residual" in parts:
            self.residual.copy_(other.residual.reshape(-1))
        if "velocity" in parts and self.velocity is not None:
            if other.velocity is None:
                self.velocity.zero_()
            else:
                self.velocity.copy_(other.velocity.reshape(-1))
        if "calls" in parts:
            self.calls = int(other.calls)
        if "extra" in parts:
            self.extra = copy.deepcopy(other.extra)
        return self

    def to(self, device) -> FeedbackState:
        """Move the tensors to ``device`` (in place; no copy where they are there); return self."""
        if self.residual.device != torch.device(device):
            self.residual = self.residual.to(device)
        if self.velocity is not None and self.velocity.device != torch.device(device):
            self.velocity = self.velocity.to(device)
        return self

    def to_dict(self) -> dict:
        """The state as a synchronizer's state dict holds it: copies on the CPU, plain values."""
        return {
            "version": STATE_VERSION,
            "calls": int(self.calls),
            "residual": self.residual.detach().cpu().clone(),
            **({} if self.velocity is None else {"velocity": self.velocity.detach().cpu().clone()}),
            **copy.deepcopy(self.extra),
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, state: dict) -> FeedbackState:
        """The state of a synchronizer's state dict (any version), sharing its tensors.

        Raises:
            ValueError: not a synchronizer state, or one of an unknown version or dtype.
        """
        if not isinstance(state, dict) or not isinstance(state.get("residual"), torch.Tensor):
            raise ValueError("not a synchronizer state (a dict with 'residual' and 'calls')")
        version = state.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(
                f"a synchronizer state of format version {version!r}: this version reads "
                f"1 and {STATE_VERSION}"
            )
        dtype = state.get("dtype", "fp32")
        if dtype not in DTYPES:
            raise ValueError(f"a synchronizer state with residual dtype {dtype!r}")
        velocity = state.get("velocity")
        return cls(
            residual=state["residual"].reshape(-1),
            velocity=velocity.reshape(-1) if isinstance(velocity, torch.Tensor) else None,
            calls=int(state.get("calls", 0)),
            extra={key: value for key, value in state.items() if key not in COMMON_KEYS},
            dtype=dtype,
        )
