"""The value axis of the wire: how a format carries float32 values (fp32, fp16, bf16).

A format says which dtype values travel in, which power of two scales a list or a row of them
(its exponent), how they go into that dtype and back, and what quantizing checks. Every codec
asks its format and never the format's name: :class:`ValueFormat` is fp32 (the values' own
bits, nothing scaled or lost), :class:`Fp16Format` scales each list by a power of two and
:class:`Bf16Format` travels unscaled and refuses an overflow on the host.
"""

from __future__ import annotations

import math

import torch

from ..checks import check_choice
from .layout import Lists

__all__ = [
    "WIRES",
    "LOWEST_EXPONENT",
    "check_wire",
    "ValueFormat",
    "HalfFormat",
    "Fp16Format",
    "Bf16Format",
    "FORMATS",
    "powers_of_two",
    "row_powers",
    "fp16_exponents",
    "finite_bf16",
]

#: The wire formats, by name.
WIRES = ("fp32", "fp16", "bf16")
#: The lowest exponent: below it a decoded fp16 value times 2^e could round in float32.
LOWEST_EXPONENT = -125
_FP16_MAX = float(torch.finfo(torch.float16).max)


def check_wire(wire) -> str:
    """Return ``wire`` if it names a wire format.

    Raises:
        ValueError: it does not; the message names the valid ones.
    """
    return check_choice("wire", wire, WIRES, "not a wire format")


class ValueFormat:
    """fp32: values travel as their own float32 bits, unscaled; quantizing is the identity."""

    #: The format's name, one of :data:`WIRES`.
    name = "fp32"
    #: The values' dtype on the wire.
    dtype = torch.float32

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire."""
        return 0

    def row_exponents(self, values: torch.Tensor, largest=None) -> torch.Tensor:
        """Return each row's :meth:`exponent` of the ``(r, w)`` ``values``, as int32 ``(r,)``.

        ``largest``: each row's largest magnitude (float32 ``(r,)``), where the caller has it.
        """
        return torch.zeros(values.shape[0], dtype=torch.int32, device=values.device)

    def list_exponents(self, values: torch.Tensor, lists: Lists) -> torch.Tensor:
        """Return the :meth:`exponent` of each of the joined ``lists`` of ``values``, as int32.

        Computed on the device, as :meth:`row_exponents`: no read.
        """
        return torch.zeros(len(lists.counts), dtype=torch.int32, device=values.device)

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` as a receiver decodes them when they travel as one list."""
        return values

    def quantize_rows(self, values: torch.Tensor, exponents: torch.Tensor | None = None):
        """Return each row of the ``(r, w)`` ``values`` as :meth:`quantize` gives it alone."""
        return values


class HalfFormat(ValueFormat):
    """A 16-bit format: values divided by 2^e (one e per list, row or piece), in 16 bits."""

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` through 16 bits and back, scaled by the list's exponent."""
        exponent = self.exponent(values)
        return self.from_half(self.to_half(values, exponent), exponent)

    def quantize_rows(self, values: torch.Tensor, exponents: torch.Tensor | None = None):
        """Return each row through 16 bits and back, scaled by its exponent: no read of data."""
        if exponents is None:
            exponents = self.row_exponents(values)
        up = row_powers(exponents)
        return self.rows_from_half(self.checked(self.rows_to_half(values, up)), up)

    def to_half(self, values: torch.Tensor, exponent: int) -> torch.Tensor:
        """Return one list's ``values`` divided by 2^``exponent``, in 16 bits."""
        if exponent:
            values = values * math.ldexp(1.0, -exponent)
        return values.to(self.dtype)

    @staticmethod
    def from_half(half: torch.Tensor, exponent: int) -> torch.Tensor:
        """Return one list's 16-bit ``half`` as float32, times 2^``exponent``."""
        values = half.float()
        return values.mul_(math.ldexp(1.0, exponent)) if exponent else values

    def checked(self, half: torch.Tensor) -> torch.Tensor:
        """Return the 16-bit values of a quantization, checked where the format asks (bf16).

        Only quantization checks: a sender quantizes what it sends before it uses it (the
        rule every method keeps), so the encoders take values that passed already.
        """
        return half

    def rows_to_half(self, values: torch.Tensor, up: torch.Tensor, out=None):
        """Return row i of ``values`` divided by 2^e_i, in 16 bits (written into ``out``).

        ``up``: the rows' 2^e_i, ``(r, 1)`` float32 (:func:`row_powers`). Dividing by 2^e gives
        the bits multiplying by 2^-e gave: both are the one rounding of the same exact value.
        """
        if out is None:
            out = torch.empty(values.shape, dtype=self.dtype, device=values.device)
        return torch.div(values, up, out=out)

    @staticmethod
    def rows_from_half(half: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Return the 16-bit rows ``half`` as float32, row i times ``up[i]``."""
        # One pass: the 16-bit values are widened as they are multiplied (float32 is the
        # common type), the same bits as widening first.
        return torch.mul(half, up)

    def lists_to_half(self, values, exponents: torch.Tensor, lists: Lists):
        """Return the joined ``lists`` of ``values``, list j divided by 2^e_j, in 16 bits."""
        return (values / lists.spread(powers_of_two(exponents))).to(self.dtype)  # as rows

    @staticmethod
    def lists_from_half(half: torch.Tensor, exponents: torch.Tensor, lists: Lists):
        """Return the joined 16-bit ``lists`` ``half`` as float32, list j times 2^e_j."""
        return torch.mul(half, lists.spread(powers_of_two(exponents)))  # widened as multiplied


class Fp16Format(HalfFormat):
    """fp16: float16 values, scaled by a power of two per list."""

    name = "fp16"
    dtype = torch.float16

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire.

        The ``e`` that puts the largest magnitude in [2^15, 65504] (at least -125), so nothing
        overflows and small lists keep their precision.

        Raises:
            ValueError: ``values`` hold NaN or inf.
        """
        if values.numel() == 0:
            return 0
        largest = float(values.abs().max())
        if not math.isfinite(largest):
            raise ValueError(f"wire={self.name!r}: a message holds NaN or inf")
        if largest == 0.0:
            return 0
        exponent = math.frexp(largest)[1] - 16
        if math.ldexp(largest, -exponent) > _FP16_MAX:
            exponent += 1
        return max(exponent, LOWEST_EXPONENT)

    def row_exponents(self, values: torch.Tensor, largest=None) -> torch.Tensor:
        """Return :meth:`exponent` of each row of the ``(r, w)`` ``values``, as int32 ``(r,)``.

        The same integers (but -125 for a row of zeros, whose zeros decode alike), computed on
        the device from the bits of each row's largest magnitude, without a read; rows must be
        finite (:func:`fp16_exponents`). ``largest``: those magnitudes, where the caller has
        them (a pass over the rows fewer).
        """
        if values.shape[1] == 0:
            return super().row_exponents(values)
        return fp16_exponents(values.abs().amax(dim=1) if largest is None else largest)

    def list_exponents(self, values: torch.Tensor, lists: Lists) -> torch.Tensor:
        """Return :meth:`exponent` of each of the joined ``lists`` (as row_exponents)."""
        if len(lists.counts) == 1 and values.numel():
            return fp16_exponents(values.abs().amax().view(1))
        largest = torch.zeros(len(lists.counts), device=values.device)
        if values.numel():
            largest.scatter_reduce_(0, lists.numbers(), values.abs(), "amax")
        return fp16_exponents(largest)


class Bf16Format(HalfFormat):
    """bf16: bfloat16 values, unscaled; on the host a value that overflows raises.

    Quantizing on the host checks for it (``ValueError``), one read per quantization (a list,
    rows, or all the parts of a call); encoding does not: what a sender encodes it quantized
    first. On a GPU quantizing reads nothing back: such a value travels as inf and shows in the
    result, as a NaN or inf gradient does there at every wire.
    """

    name = "bf16"
    dtype = torch.bfloat16

    def to_half(self, values: torch.Tensor, exponent: int) -> torch.Tensor:
        """Return ``values`` in bfloat16, checked on the host (:func:`finite_bf16`)."""
        return finite_bf16(super().to_half(values, exponent))

    def checked(self, half: torch.Tensor) -> torch.Tensor:
        """Return ``half``, checked on the host (:func:`finite_bf16`)."""
        return finite_bf16(half)

    def rows_to_half(self, values: torch.Tensor, up: torch.Tensor, out=None):
        """Return the rows in bfloat16 (written into ``out``): every 2^e is 1."""
        return values.to(self.dtype) if out is None else out.copy_(values)  # every 2^e is 1

    def lists_to_half(self, values, exponents: torch.Tensor, lists: Lists):
        """Return the joined lists in bfloat16, unscaled."""
        return values.to(self.dtype)

    @staticmethod
    def lists_from_half(half: torch.Tensor, exponents: torch.Tensor, lists: Lists):
        """Return the joined bfloat16 lists as float32, unscaled."""
        return half.float()


#: Each wire's value format.
FORMATS = {"fp32": ValueFormat(), "fp16": Fp16Format(), "bf16": Bf16Format()}


def row_powers(exponents: torch.Tensor) -> torch.Tensor:
    """Return 2^e of each row's exponent as a ``(r, 1)`` column (:func:`powers_of_two`)."""
    return powers_of_two(exponents).unsqueeze(1)


def powers_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """Return 2^e (float32, exact) of int32 ``exponents``, e in [-126, 127].

    Built from the bits, three operations. Values go into 16 bits divided by 2^e: the bits
    multiplying by 2^-e gave (both are the one rounding of the same exact value), with one
    power of two made instead of two.
    """
    return (exponents + 127).bitwise_left_shift_(23).view(torch.float32)


def finite_bf16(half: torch.Tensor) -> torch.Tensor:
    """Return ``half``; on the host, ``ValueError`` where a value is NaN or inf (one read).

    Elsewhere nothing is read: a read would be a wait for the device per quantization.
    """
    if half.device.type == "cpu" and half.numel() and not bool(torch.isfinite(half).all()):
        raise ValueError("wire='bf16': a message holds NaN or inf")
    return half


def fp16_exponents(largest: torch.Tensor) -> torch.Tensor:
    """Return the fp16 exponent (int32) of lists whose largest magnitudes are ``largest``.

    For a normal largest |v| = (1 + f) 2^(b - 127), e = b - 142, plus 1 where (1 + f) 2^15 >
    65504, i.e. f's 23 bits exceed 0x7FE000: adding 0x1FFF carries exactly then; at least -125.
    """
    exponents = largest.view(torch.int32).add(0x1FFF).bitwise_right_shift_(23)
    return exponents.clamp_(min=LOWEST_EXPONENT + 142).sub_(142)
