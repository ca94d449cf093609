"""The records `phantora-ns3-runner --records` prints, parsed into the in-process engine's types.

One record per line, its kind first (ns3-scratch/runner/runner-records.h): completions (C) and progress ticks
(T) while the run goes on, then FCTs (F), PFC frames (P), queue samples (Q), drops (D), trims (R), CNPs (N),
CE marks (E), transport counters (X), channels (L), the fabric's counters (S) and the end (Z). What the fabric runs
by (A: its attributes read back, `phantora.netsim.effective`) comes first, before the run (a runner built before
that prints it before Z), so a caller can warn of its settings at once (`RecordParser`'s ``on_effective``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phantora.netsim.base import Completion
from phantora.netsim.hpcc_io import FctLine, PfcLine, pfc_txt_lines
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
)
from phantora.netsim.packet_summary import ChannelRow, channel_usage, packet_stats

if TYPE_CHECKING:
    from phantora.netsim.packet_config import PacketConfig
    from phantora.topology.model import Topology

# tick(completions since the last tick, now ns, events so far)
Tick = Callable[[list[Completion], int, int], None]
# on_effective(the A records' (key, text) pairs), once they are all in
OnEffective = Callable[[list[tuple[str, str]]], None]


@dataclass
class RunnerRecords:
    """Everything netsim reads from a packet run, as the in-process engine's accessors return it."""

    done: list[Completion] = field(default_factory=list)
    fct: list[FctLine] = field(default_factory=list)
    pfc: list[PfcEvent] = field(default_factory=list)
    queues: list[QueueSample] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)
    trims: list[Trim] = field(default_factory=list)
    cnps: list[CnpEvent] = field(default_factory=list)
    ecn: list[EcnMark] = field(default_factory=list)
    transport: dict[int, FlowTransport] = field(default_factory=dict)
    channels: list[ChannelRow] = field(default_factory=list)
    raw_stats: list[tuple[str, float]] = field(default_factory=list)
    effective: list[tuple[str, str]] = field(default_factory=list)  # EffectiveParams(): (key, text) pairs
    now: int = 0
    quiet: bool = False
    ended: bool = False  # the Z line arrived
    stuck: tuple[int, int] | None = None  # (flows in flight, now) when the network cannot drain (U)

    def pfc_lines(self) -> list[PfcLine]:
        """pfc.txt records (HPCC numbers ports from 1)."""
        return pfc_txt_lines(self.pfc)

    def channel_usage(self, elapsed_ns: int) -> list[PacketChannelUsage]:
        return channel_usage(self.channels, elapsed_ns)

    def stats(self, config: PacketConfig, topology: Topology) -> dict[str, object]:
        return packet_stats(self.raw_stats, self.drops, self.trims, config, topology, self.channels)


class RecordParser:
    """Feeds the runner's lines into a `RunnerRecords`; `tick` is called at each T line, `on_effective` at the
    first line after the A records."""

    def __init__(self, tags: dict[int, str], tick: Tick | None = None, on_effective: OnEffective | None = None) -> None:
        """`tags`: flow id -> tag, given to the completions (and taken out, as the in-process engine does)."""
        self.records = RunnerRecords()
        self._tags = tags
        self._tick = tick
        self._on_effective = on_effective
        self._since: list[Completion] = []

    def feed(self, line: str) -> None:
        """One line of the runner's output."""
        kind, _, rest = line.partition(" ")
        r = self.records
        if kind != "A" and r.effective and self._on_effective is not None:
            told, self._on_effective = self._on_effective, None
            told(r.effective)
        if kind == "Q":
            r.queues.append(QueueSample(*map(int, rest.split())))
        elif kind == "C":
            self._completion([int(w) for w in rest.split()])
        elif kind == "T":
            now, events = rest.split()
            r.now = int(now)
            if self._tick is not None:
                self._tick(self._since, r.now, int(float(events)))
            self._since = []
        elif kind == "S":
            key, value = rest.split()
            r.raw_stats.append((key, float(value)))
        elif kind == "A":
            key, _, text = rest.partition(" ")
            r.effective.append((key, text))
        elif kind == "Z":
            quiet, now = rest.split()
            r.quiet, r.now, r.ended = quiet == "1", int(now), True
        elif kind == "U":
            left, now = rest.split()
            r.stuck = (int(left), int(now))
        else:
            self._record(kind, [int(w) for w in rest.split()])

    def _completion(self, w: list[int]) -> None:
        fid = w[0]
        holes = tuple((w[i], w[i + 1]) for i in range(6, len(w), 2))
        c = Completion(fid, w[1], w[2], w[3], w[4], w[5], self._tags.pop(fid, ""), holes)
        self.records.done.append(c)
        self._since.append(c)

    def _record(self, kind: str, w: list[int]) -> None:
        r = self.records
        if kind == "F":
            r.fct.append(FctLine(*w))
        elif kind == "P":
            r.pfc.append(PfcEvent(w[0], w[1], w[2], w[3], w[4], bool(w[5]), w[6]))
        elif kind == "D":
            r.drops.append(Drop(*w))
        elif kind == "R":
            r.trims.append(Trim(*w))
        elif kind == "N":
            r.cnps.append(CnpEvent(*w))
        elif kind == "E":
            r.ecn.append(EcnMark(*w))
        elif kind == "X":
            r.transport[w[0]] = FlowTransport(*w)
        elif kind == "L":
            r.channels.append((w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]))
        else:
            raise ValueError(f"phantora-ns3-runner: unknown record {kind!r}")
