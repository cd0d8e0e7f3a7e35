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

- :class:`Cluster`, hosts on a switch (scripts/cluster_network.sh): rank r on host
  ``(r // G) % N`` (G ranks per host), each host with its own link of its own rate. A message
  between hosts is charged on the sender host's uplink and the receiver host's downlink, and the
  messages of a round that share a link share its rate: a round's transfer time is its most
  loaded link's ``bytes / rate`` (a transfer between a fast and a slow host runs at the slower
  rate). Messages within a host go through shared memory: ``shm_alpha`` per message, and the
  host's intra-host bytes over ``shm_rate``. A round costs the busiest rank's per-message costs
  (``alpha`` per message between hosts, ``shm_alpha`` within one) plus the slower of its link
  and shared-memory transfer times. It needs to know where each message goes: the simulator
  gives it every round's bytes and messages from each rank to each rank
  (:meth:`Cluster.traffic_seconds`). ``cores``, as for :class:`SharedLink`: the cores all ranks
  share (on the testbed every emulated host runs on the same machine's cores).

Every round costs at least one ``alpha`` (a round is a wait for a message); a round whose
messages all stay within hosts, at least one ``shm_alpha``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SHARED",
    "TESTBED_ALPHA",
    "SHM_ALPHA",
    "SHM_RATE",
    "CLUSTER",
    "Network",
    "SharedLink",
    "Cluster",
    "PRESETS",
    "parse_rate",
    "parse_network",
    "parse_delay",
    "parse_topology",
    "cluster_network",
]

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

SHARED = "shared"
# The default cost per message of shared:RATE: MPICH over TCP on one host's shaped loopback with
# a core per rank, as ``python -m syncbench.latency`` measured it with 2 ranks on 2 cores inside
# scripts/shaped_network.sh (164 us at 1gbit). Measure it with no more ranks than cores: with
# more, each message also waits for its receiver to be scheduled, which the local-work term
# already prices through the compute share (counting it in both over-predicts multi-round
# methods by up to 56%). Pass another value as scripts/simulate.py --message-cost.
TESTBED_ALPHA = 160e-6
# The defaults of a Cluster's shared memory: MPICH's cost per message and its copy rate between
# two ranks of one host of scripts/cluster_network.sh, measured with 2 ranks on 2 cores (25 us a
# round with python -m syncbench.latency; 4.5-5.5 GB/s for 8-32 MB messages; docs/CLUSTER.md).
SHM_ALPHA = 25e-6
SHM_RATE = 4e9
CLUSTER = "cluster"
_TIME_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "ms": 1e-3,
    "msec": 1e-3,
    "us": 1e-6,
    "usec": 1e-6,
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


@dataclass(frozen=True)
class Cluster:
    """Hosts with a link each on one switch, several ranks per host (module docstring).

    ``rates``: bytes/s of each host's link (one value: every host's); ``hosts``: their number
    (``None``: as many as P ranks fill, ``ceil(P / ranks_per_host)``, with one rate); ``alpha``:
    seconds per message between hosts; ``shm_alpha`` and ``shm_rate``: seconds per message and
    bytes/s of a host's shared memory; ``cores``: the cores all ranks share (``None``: a core per
    rank).
    """

    name: str
    rates: tuple
    ranks_per_host: int = 1
    hosts: int | None = None
    alpha: float = TESTBED_ALPHA
    shm_alpha: float = SHM_ALPHA
    shm_rate: float = SHM_RATE
    cores: int | None = None

    @property
    def beta(self) -> float:
        """Seconds per byte of the slowest host link."""
        return 1 / min(self.rates)

    def host_count(self, workers: int) -> int:
        """The hosts ``workers`` ranks run on."""
        return self.hosts or math.ceil(workers / self.ranks_per_host)

    def placement(self, workers: int) -> np.ndarray:
        """The host of each rank: rank r on host ``(r // ranks_per_host) % hosts``."""
        return (np.arange(workers) // self.ranks_per_host) % self.host_count(workers)

    def link_rates(self, workers: int) -> np.ndarray:
        """Bytes/s of each host's link at ``workers`` ranks."""
        hosts = self.host_count(workers)
        if len(self.rates) == 1:
            return np.full(hosts, float(self.rates[0]))
        if len(self.rates) != hosts:
            raise ValueError(f"{self.name}: {len(self.rates)} rates for {hosts} hosts")
        return np.asarray(self.rates, dtype=float)

    def traffic_seconds(self, messages: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """Seconds of each round.

        ``messages[i, w, v]`` and ``sent[i, w, v]`` (bytes) are what rank w sends to rank v in
        round i.
        """
        workers = messages.shape[1]
        host = self.placement(workers)
        member = np.zeros((workers, self.host_count(workers)))
        member[np.arange(workers), host] = 1.0
        between = host[:, None] != host[None, :]
        inter = sent * between
        uplink = np.einsum("iwv,wh->ih", inter, member)
        downlink = np.einsum("iwv,vh->ih", inter, member)
        rates = self.link_rates(workers)
        link = (np.maximum(uplink, downlink) / rates).max(axis=1, initial=0.0)
        local = np.einsum("iwv,wh->ih", sent * ~between, member)
        memory = local.max(axis=1, initial=0.0) / self.shm_rate
        remote_messages = (messages * between).sum(axis=2)
        local_messages = (messages * ~between).sum(axis=2)
        per_message = (remote_messages * self.alpha + local_messages * self.shm_alpha).max(
            axis=1, initial=0.0
        )
        floor = np.where(remote_messages.sum(axis=1) > 0, self.alpha, self.shm_alpha)
        return np.maximum(per_message + np.maximum(link, memory), floor)

    def compute_share(self, workers: int) -> float:
        """How many times longer each of ``workers`` ranks computes than on a core of its own."""
        return 1.0 if self.cores is None else max(1.0, workers / self.cores)

    def topology(self, workers: int) -> dict:
        """The cluster at ``workers`` ranks, as ``SPARDL_CLUSTER`` writes it (rates in bits/s)."""
        return {
            "hosts": self.host_count(workers),
            "ranks_per_host": self.ranks_per_host,
            "rates": [_rate_name(rate) for rate in self.link_rates(workers)],
        }

    def describe(self) -> str:
        """The model in a few words, for table headers."""
        hosts = "hosts" if self.hosts is None else f"{self.hosts} hosts"
        rates = "/".join(f"{rate * 8 / 1e9:g}" for rate in self.rates)
        cores = (
            "a core per rank" if self.cores is None else f"{self.cores} cores shared by all ranks"
        )
        return (
            f"{hosts} of {self.ranks_per_host} ranks, links of {rates} Gbit/s, "
            f"alpha {self.alpha * 1e6:g} us between hosts, shared memory "
            f"{self.shm_alpha * 1e6:g} us + {self.shm_rate / 1e9:g} GB/s within, {cores}"
        )


PRESETS = {
    "ethernet": Network("ethernet", 25e-6, 1 / 1.25e9),
    "infiniband": Network("infiniband", 1.5e-6, 1 / 12.5e9),
}


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


def _rate_name(rate: float) -> str:
    """A rate in bytes/s written in tc's bit units: ``1gbit``, ``100mbit``, ``2.5e+06bit``."""
    bits = rate * 8
    for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= size and (bits / size) == round(bits / size, 3):
            return f"{bits / size:g}{unit}"
    return f"{bits:g}bit"


def parse_delay(text: str) -> float:
    """Seconds of a delay as tc writes it (``100us``, ``2ms``, ``0.1s``); else ``ValueError``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _TIME_UNITS:
        raise ValueError(f"{text!r} is not a delay: a number with one of s, ms, us")
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


def parse_topology(value) -> dict:
    """The cluster described by ``value``, checked.

    A dict or its JSON text, as ``SPARDL_CLUSTER`` holds it: ``{"hosts": N, "ranks_per_host": G,
    "rates": [R1, ..., RN] (or one rate for all), "delay": T or null}``; ``hosts`` may be left
    out (or null) with one rate, for as many hosts as the ranks fill. Returns it with ``rates`` in
    bytes/s and ``delay`` in seconds; ``ValueError`` with one line saying what is wrong.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"topology {value!r} is not JSON") from None
    if not isinstance(value, dict) or not isinstance(value.get("rates"), (list, str)):
        raise ValueError(
            f"topology {value!r}: need an object with 'rates' (and 'hosts', 'ranks_per_host')"
        )
    hosts, per_host = value.get("hosts"), value.get("ranks_per_host", 1)
    for key, number in (("hosts", hosts), ("ranks_per_host", per_host)):
        if number is not None and (type(number) is not int or number < 1):
            raise ValueError(f"topology: {key} must be a whole number >= 1, got {number!r}")
    written = [value["rates"]] if isinstance(value["rates"], str) else value["rates"]
    rates = tuple(parse_rate(str(rate)) for rate in written)
    if not rates or (len(rates) > 1 and len(rates) != hosts):
        raise ValueError(
            f"topology: {len(rates)} rates for {hosts} hosts: give one rate, or one per host"
        )
    delay = value.get("delay")
    return {
        "hosts": hosts,
        "ranks_per_host": per_host,
        "rates": rates,
        "delay": 0.0 if delay is None else parse_delay(delay),
    }


def cluster_network(
    value,
    message_cost: float = TESTBED_ALPHA,
    cores: int | None = None,
    shm_cost: float = SHM_ALPHA,
    shm_rate: float = SHM_RATE,
) -> Cluster:
    """The :class:`Cluster` of a topology (:func:`parse_topology`).

    ``message_cost`` seconds per message between hosts plus the topology's one-way delay,
    ``shm_cost`` and ``shm_rate`` (bytes/s) within a host, ``cores`` shared by all ranks.
    """
    topology = parse_topology(value)
    rates = ",".join(
        map(
            _rate_name,
            dict.fromkeys(topology["rates"])
            if len(set(topology["rates"])) == 1
            else topology["rates"],
        )
    )
    hosts = topology["hosts"] or "N"
    return Cluster(
        f"{CLUSTER}:{hosts}x{topology['ranks_per_host']}@{rates}",
        topology["rates"],
        topology["ranks_per_host"],
        topology["hosts"],
        message_cost + topology["delay"],
        shm_cost,
        shm_rate,
        cores,
    )
