"""Network models of the simulator.

The time of each round of messages, given what every rank sends in it.

- :class:`Network`, the alpha-beta model of a switched network where every rank has its own
  link: a round costs its busiest rank's ``messages * alpha + bytes * beta``. The presets
  ``ethernet`` and ``infiniband``, and ``--alpha``/``--beta`` for another.
- :class:`SharedLink`, this project's testbed: P ranks on one host whose traffic all passes one
  link of rate R (scripts/shaped_network.sh shapes a namespace's loopback with ``tc tbf``, and
  every byte any rank sends takes tokens from that one bucket). A round costs
  ``alpha * (messages of its busiest rank) + (bytes all ranks send in it) / R``: the bytes
  serialize through the link, while the ranks pay their per-message costs side by side. With
  ``cores`` given, the P ranks also share that many cores, so each rank's computing (its
  selections) takes max(1, P / cores) times as long as on a core of its own.

Every round costs at least one ``alpha`` (a round is a wait for a message).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# Units of a rate as tc writes them: bits per second (a bare number too), or bytes per second.
_RATE_UNITS = {
    "": 1 / 8,
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "tbps": 1e12,
}


@dataclass(frozen=True)
class Network:
    """An alpha-beta network: ``alpha`` seconds per message, ``beta`` seconds per byte, per rank."""

    name: str
    alpha: float
    beta: float

    def round_seconds(self, messages: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """Seconds of each round.

        ``messages[w, i]`` and ``sent[w, i]`` (bytes) are what rank w sends in round i.
        """
        busiest = (messages * self.alpha + sent * self.beta).max(axis=0, initial=0.0)
        return np.maximum(busiest, self.alpha)

    def compute_share(self, workers: int) -> float:
        """How many times longer a rank computes than on a core of its own: 1 (a host per rank)."""
        return 1.0

    def describe(self) -> str:
        """The model in a few words, for table headers."""
        return f"alpha {self.alpha * 1e6:g} us, beta {self.beta * 1e9:g} ns/B per rank"


@dataclass(frozen=True)
class SharedLink:
    """P ranks sharing one link (module docstring).

    The link carries ``rate`` bytes/s at ``alpha`` seconds per message; the ranks share ``cores``
    cores (``None``: a core per rank).
    """

    name: str
    alpha: float
    rate: float
    cores: int | None = None

    @property
    def beta(self) -> float:
        """Seconds per byte of the shared link."""
        return 1 / self.rate

    def round_seconds(self, messages: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """Seconds of each round.

        ``messages[w, i]`` and ``sent[w, i]`` (bytes) are what rank w sends in round i.
        """
        per_message = messages.max(axis=0, initial=0.0) * self.alpha
        return np.maximum(per_message + sent.sum(axis=0) / self.rate, self.alpha)

    def compute_share(self, workers: int) -> float:
        """How many times longer each of ``workers`` ranks computes than on a core of its own."""
        return 1.0 if self.cores is None else max(1.0, workers / self.cores)

    def describe(self) -> str:
        """The model in a few words, for table headers."""
        cores = (
            "a core per rank" if self.cores is None else f"{self.cores} cores shared by all ranks"
        )
        return (
            f"one link of {self.rate * 8 / 1e9:g} Gbit/s shared by all ranks, "
            f"alpha {self.alpha * 1e6:g} us, "
            f"{cores}"
        )


PRESETS = {
    "ethernet": Network("ethernet", 25e-6, 1 / 1.25e9),
    "infiniband": Network("infiniband", 1.5e-6, 1 / 12.5e9),
}
SHARED = "shared"
# The default cost per message of shared:RATE: MPICH over TCP on one host's shaped loopback with
# a core per rank, as ``python -m syncbench.latency`` measured it with 2 ranks on 2 cores inside
# scripts/shaped_network.sh (164 us at 1gbit). Measure it with no more ranks than cores: with
# more, each message also waits for its receiver to be scheduled, which the local-work term
# already prices through the compute share (counting it in both over-predicts multi-round
# methods by up to 56%). Pass another value as scripts/simulate.py --message-cost.
TESTBED_ALPHA = 160e-6


def parse_rate(text: str) -> float:
    """Bytes per second of a rate written as tc takes it.

    For example ``1gbit``, ``100mbit``, ``125mbps`` or ``1e9bit``; ``ValueError`` otherwise.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"{text!r} is not a rate: a positive number with one of the units "
            f"{', '.join(unit for unit in _RATE_UNITS if unit)} (bit: bits/s, bps: bytes/s)"
        )
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def parse_network(spec: str, message_cost: float = TESTBED_ALPHA, cores: int | None = None):
    """The network named by ``spec``.

    A preset (``ethernet``, ``infiniband``) or ``shared:RATE``, this testbed's link at RATE
    (:func:`parse_rate`) with ``message_cost`` seconds per message and ``cores`` cores shared by the
    ranks; ``ValueError`` naming the valid choices otherwise.
    """
    if spec in PRESETS:
        return PRESETS[spec]
    kind, _, rate = spec.partition(":")
    if kind == SHARED and rate:
        return SharedLink(spec, message_cost, parse_rate(rate), cores)
    raise ValueError(
        f"--network {spec}: unknown network; valid: {', '.join(PRESETS)}, "
        f"{SHARED}:RATE (e.g. {SHARED}:1gbit)"
    )
