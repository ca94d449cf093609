"""The scenario file: faults, stragglers and background traffic at simulated times or step boundaries.

A scenario is TOML (docs/scenarios.md)::

    name = "uplink-fails"        # optional (default: the file's stem)
    seed = 1                     # seeds every random draw (background, loss)
    reconvergence = "50us"       # routing re-converges this long after a link changes (default 0)

    [[events]]
    kind = "link_down"           # link_down | link_up | link_flap | link_degrade | switch_down | nic_down
    at = "2ms"                   #   | gpu_slow | background; or at_step = 3 (a step boundary)
    link = ["leaf0", "spine0"]   # two node names (or ids)

`read_scenario` parses and checks the file into frozen dataclasses (errors name the file, the line of the
``[[events]]`` entry and the field); `bind` resolves node names against a topology.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.files import parse_toml, read_text
from phantora.perfmodel.throttle import Throttle, Throttles
from phantora.topology._util import rate_bps, relocate, time_ns
from phantora.topology.model import Topology

KINDS = (
    "link_down",
    "link_up",
    "link_flap",
    "link_degrade",
    "switch_down",
    "nic_down",
    "gpu_slow",
    "background",
)
NETWORK_KINDS = ("link_down", "link_up", "link_flap", "link_degrade", "switch_down", "nic_down")
TOP_KEYS = ("name", "description", "seed", "reconvergence", "events")
_WHEN = ("kind", "at", "at_step")
KEYS: dict[str, tuple[str, ...]] = {
    "link_down": (*_WHEN, "link", "duration"),
    "link_up": (*_WHEN, "link"),
    "link_flap": (*_WHEN, "link", "period", "duty", "count"),
    "link_degrade": (*_WHEN, "link", "duration", "rate", "extra_latency", "loss"),
    "switch_down": (*_WHEN, "switch", "duration"),
    "nic_down": (*_WHEN, "node", "rank", "nic", "duration"),
    "gpu_slow": (*_WHEN, "from", "rank", "factor", "duration"),
    "background": (*_WHEN, "duration", "hosts", "cdf", "load", "seed"),
}

NodeRef = str | int


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every event has: when (a simulated time or a step boundary) and where it is in the file."""

    kind: str
    at_ns: int | None = None  # a simulated time
    at_step: int | None = None  # or the start of this step (0 = the first)
    duration_ns: int | None = None  # None: until the end of the run (or an explicit undo event)
    index: int = 0  # position among the file's [[events]]
    line: int | None = None  # line of its [[events]] header

    @property
    def label(self) -> str:
        """A short name for reports: 'link_down#2'."""
        return f"{self.kind}#{self.index}"


@dataclass(frozen=True, kw_only=True)
class LinkEvent(Event):
    """link_down, link_up, link_flap and link_degrade: one link, named by its two end nodes."""

    link: tuple[NodeRef, NodeRef]
    period_ns: int = 0  # link_flap: one down+up cycle
    duty: float = 0.0  # link_flap: the share of each period the link is down
    count: int = 1  # link_flap: how many periods
    rate_bps: int | None = None  # link_degrade: the new rate (None: unchanged)
    extra_latency_ns: int = 0  # link_degrade
    loss: float = 0.0  # link_degrade: random loss rate of packets (flow mode: goodput x (1 - loss))


@dataclass(frozen=True, kw_only=True)
class NodeEvent(Event):
    """switch_down (a switch's name) and nic_down (an endpoint's name, or a rank; `nic`: which of its NICs)."""

    node: NodeRef | None = None
    rank: int | None = None
    nic: NodeRef = 0  # nic_down: the NIC's index among the endpoint's switch links (by link id), or its switch


@dataclass(frozen=True, kw_only=True)
class GpuSlow(Event):
    """A rank's compute runs `factor` times slower from `at` for `duration` (a thermal or power throttle)."""

    rank: int
    factor: float


@dataclass(frozen=True, kw_only=True)
class Background(Event):
    """Poisson flows of a size distribution at `load` x the NIC rate of each chosen host."""

    hosts: tuple[int, ...] | None  # ranks; None = every endpoint
    cdf: str  # websearch | hadoop | a CDF file (docs/scenarios.md)
    load: float
    seed: int | None = None  # None: the scenario's seed


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario file."""

    name: str
    events: tuple[Event, ...]
    seed: int = 0
    reconvergence_ns: int = 0
    source: str | None = None
    description: str = ""

    def of_kind(self, *kinds: str) -> list[Event]:
        """The events of these kinds, in file order."""
        return [e for e in self.events if e.kind in kinds]

    def gpu_slow(self) -> list[GpuSlow]:
        return [e for e in self.events if isinstance(e, GpuSlow)]

    def background(self) -> list[Background]:
        return [e for e in self.events if isinstance(e, Background)]

    def network(self) -> list[Event]:
        return self.of_kind(*NETWORK_KINDS)

    def throttles(self, step_starts: dict[int, int] | None = None) -> Throttles:
        """The gpu_slow windows; those at a step boundary need `step_starts` (step -> ns) and are left out
        when it does not have their step."""
        out = []
        for ev in self.gpu_slow():
            start = ev.at_ns if ev.at_step is None else (step_starts or {}).get(ev.at_step)
            if start is not None:
                end = None if ev.duration_ns is None else start + ev.duration_ns
                out.append(Throttle(ev.rank, start, end, ev.factor))
        return Throttles(out)


def _header_lines(text: str) -> list[int]:
    pat = re.compile(r"^\s*\[\[\s*events\s*\]\]")
    return [no for no, line in enumerate(text.splitlines(), 1) if pat.match(line)]


class _Entry:
    """One [[events]] table with the file, line and field prefix every error names."""

    def __init__(self, table: dict[str, Any], file: str, line: int | None, index: int) -> None:
        self.t, self.file, self.line, self.index = table, file, line, index
        self.where = f"events[{index}]."

    def err(self, message: str, key: str) -> InputError:
        return InputError(message, file=self.file, line=self.line, field=self.where + key)

    def time(self, key: str, default: int | None = None) -> int | None:
        if key not in self.t:
            return default
        return time_ns(self.t[key], self.where + key, file=self.file, line=self.line)

    def rate(self, key: str) -> int | None:
        if key not in self.t:
            return None
        return rate_bps(self.t[key], self.where + key, file=self.file, line=self.line)

    def integer(self, key: str, minimum: int, default: int | None = None) -> int | None:
        if key not in self.t:
            return default
        v = self.t[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(f"expected an integer, got {v!r}", key)
        if v < minimum:
            raise self.err(f"must be >= {minimum}, got {v}", key)
        return v

    def number(self, key: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
        v = self.t.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(f"expected a number, got {v!r}", key)
        x = float(v)
        bad = x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi)
        if bad:
            left, right = "(" if lo_open else "[", ")" if hi_open else "]"
            raise self.err(f"must be in {left}{lo}, {hi}{right}, got {v!r}", key)
        return x

    def node(self, key: str) -> NodeRef:
        v = self.t.get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
        raise self.err(f"expected a node name or id, got {v!r}", key)

    def link(self) -> tuple[NodeRef, NodeRef]:
        v = self.t.get("link")
        if not isinstance(v, list) or len(v) != 2:
            raise self.err(f"expected two node names such as ['leaf0', 'spine0'], got {v!r}", "link")
        ends = []
        for x in v:
            if not (isinstance(x, str) and x) and not (isinstance(x, int) and not isinstance(x, bool) and x >= 0):
                raise self.err(f"expected a node name or id, got {x!r}", "link")
            ends.append(x)
        if ends[0] == ends[1]:
            raise self.err("a link joins two different nodes", "link")
        return ends[0], ends[1]


def _common(e: _Entry, kind: str) -> dict[str, Any]:
    for key in e.t:
        if key not in KEYS[kind]:
            raise e.err(f"unknown field for {kind} (known: {', '.join(KEYS[kind])})", key)
    if kind == "gpu_slow" and "from" in e.t:
        if "at" in e.t:
            raise e.err("give at or from (the same thing), not both", "from")
        e.t = dict(e.t, at=e.t.pop("from"))
    has_at, has_step = "at" in e.t, "at_step" in e.t
    if has_at == has_step:
        raise e.err("give exactly one of at (a simulated time, '2ms') or at_step (a step number)", "at")
    duration = e.time("duration")
    if "duration" in e.t and not duration:
        raise e.err("must be positive (leave it out to last until the end)", "duration")
    return dict(
        kind=kind,
        at_ns=e.time("at"),
        at_step=e.integer("at_step", 0),
        duration_ns=duration,
        index=e.index,
        line=e.line,
    )


def _event(e: _Entry) -> Event:
    kind = e.t.get("kind")
    if kind not in KINDS:
        raise e.err(f"expected one of {', '.join(KINDS)}, got {kind!r}", "kind")
    base = _common(e, kind)
    if kind in ("link_down", "link_up"):
        return LinkEvent(**base, link=e.link())
    if kind == "link_flap":
        period = e.time("period")
        if not period:
            raise e.err("a flap needs a positive period ('1ms')", "period")
        duty = e.number("duty", 0.0, 1.0, lo_open=True, hi_open=True)
        count = e.integer("count", 1, 1)
        assert count is not None
        if int(period * duty) == 0:
            raise e.err(f"period x duty is under 1 ns ({period} ns x {duty})", "duty")
        return LinkEvent(**base, link=e.link(), period_ns=period, duty=duty, count=count)
    if kind == "link_degrade":
        rate = e.rate("rate")
        extra = e.time("extra_latency", 0)
        loss = e.number("loss", 0.0, 1.0, hi_open=True) if "loss" in e.t else 0.0
        if rate is None and not extra and not loss:
            raise e.err("a degrade needs rate, extra_latency or loss", "rate")
        return LinkEvent(**base, link=e.link(), rate_bps=rate, extra_latency_ns=extra or 0, loss=loss)
    if kind == "switch_down":
        return NodeEvent(**base, node=e.node("switch"))
    if kind == "nic_down":
        if ("node" in e.t) == ("rank" in e.t):
            raise e.err("name the NIC by node (a GPU or host name) or by rank, one of them", "node")
        nic = e.t.get("nic", 0)
        if isinstance(nic, bool) or not isinstance(nic, (int, str)) or isinstance(nic, int) and nic < 0:
            raise e.err(f"a NIC index (0, 1, ...) or the name of its switch, got {nic!r}", "nic")
        if "rank" in e.t:
            return NodeEvent(**base, rank=e.integer("rank", 0), nic=nic)
        return NodeEvent(**base, node=e.node("node"), nic=nic)
    if kind == "gpu_slow":
        rank = e.integer("rank", 0)
        if rank is None:
            raise e.err("missing: the rank whose GPU slows", "rank")
        factor = e.number("factor", 0.0, float("inf"), lo_open=True, hi_open=True)
        return GpuSlow(**base, rank=rank, factor=factor)
    return _background(e, base)


def _background(e: _Entry, base: dict[str, Any]) -> Background:
    if base["at_step"] is not None:
        raise e.err("background traffic starts at a simulated time (at = '0ms')", "at_step")
    hosts = e.t.get("hosts", "all")
    if hosts == "all":
        ranks = None
    elif isinstance(hosts, list) and len(hosts) >= 2 and all(isinstance(h, int) and h >= 0 for h in hosts):
        if len(set(hosts)) != len(hosts):
            raise e.err("a host is listed twice", "hosts")
        ranks = tuple(hosts)
    else:
        raise e.err(f"expected 'all' or a list of 2+ ranks, got {hosts!r}", "hosts")
    cdf = e.t.get("cdf")
    if not isinstance(cdf, str) or not cdf:
        raise e.err("expected websearch, hadoop or a CDF file path", "cdf")
    load = e.number("load", 0.0, 1.0, lo_open=True)
    if base["duration_ns"] is None:
        raise e.err("background traffic needs a duration (its flows are drawn for that window)", "duration")
    return Background(**base, hosts=ranks, cdf=cdf, load=load, seed=e.integer("seed", 0))


def parse_scenario(text: str, file: str) -> Scenario:
    """A scenario from TOML text (errors name `file`, the line of the [[events]] entry, and the field)."""
    data = parse_toml(text, file)
    for key in data:
        if key not in TOP_KEYS:
            raise InputError(f"unknown field (known: {', '.join(TOP_KEYS)})", file=file, field=key)
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise InputError("expected a string", file=file, field=key)
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"expected an integer >= 0, got {seed!r}", file=file, field="seed")
    reconv = time_ns(data.get("reconvergence", 0), "reconvergence", file=file)
    raw = data.get("events", [])
    if not isinstance(raw, list):
        raise InputError("expected an array of tables ([[events]])", file=file, field="events")
    lines = _header_lines(text)
    events = []
    for i, table in enumerate(raw):
        line = lines[i] if len(lines) == len(raw) else None
        if not isinstance(table, dict):
            raise InputError("expected a table", file=file, line=line, field=f"events[{i}]")
        events.append(_event(_Entry(dict(table), file, line, i)))
    name = data.get("name") or Path(file).stem
    return Scenario(name, tuple(events), seed, reconv, file, data.get("description", ""))


def read_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file."""
    return parse_scenario(read_text(path, "scenario file"), str(path))


# ----- binding to a topology -------------------------------------------------------------------------------


def _err(sc: Scenario, ev: Event, message: str, key: str) -> InputError:
    return InputError(message, file=sc.source, line=ev.line, field=f"events[{ev.index}].{key}")


def node_id(topo: Topology, ref: NodeRef) -> int | None:
    """The node a name or id means in `topo`, or None."""
    if isinstance(ref, int):
        return ref if 0 <= ref < len(topo.nodes) else None
    for n in topo.nodes:
        if n.name == ref:
            return n.id
    return None


def link_id(sc: Scenario, ev: LinkEvent, topo: Topology) -> int:
    """The id of the link an event names (an InputError naming the file, line and field if there is none)."""
    ends = []
    for ref in ev.link:
        nid = node_id(topo, ref)
        if nid is None:
            raise _err(sc, ev, f"no node {ref!r} in topology '{topo.name}'", "link")
        ends.append(nid)
    for v, ch in topo.neighbours(ends[0]):
        if v == ends[1]:
            return ch >> 1
    raise _err(sc, ev, f"no link between {ev.link[0]!r} and {ev.link[1]!r} in '{topo.name}'", "link")


def node_links(sc: Scenario, ev: NodeEvent, topo: Topology) -> tuple[int, ...]:
    """The links a switch_down or nic_down takes down (a NIC: the endpoint's links to switches)."""
    key = "switch" if ev.kind == "switch_down" else ("rank" if ev.rank is not None else "node")
    if ev.rank is not None:
        if not 0 <= ev.rank < topo.num_ranks:
            raise _err(sc, ev, f"rank {ev.rank} is outside '{topo.name}' ({topo.num_ranks} ranks)", key)
        nid: int | None = topo.node_of_rank(ev.rank)
    else:
        assert ev.node is not None
        nid = node_id(topo, ev.node)
        if nid is None:
            raise _err(sc, ev, f"no node {ev.node!r} in topology '{topo.name}'", key)
    assert nid is not None
    kind = topo.nodes[nid].kind
    if ev.kind == "switch_down" and kind not in ("switch", "nvswitch"):
        raise _err(sc, ev, f"{topo.nodes[nid].name} is a {kind}, not a switch", key)
    if ev.kind == "nic_down":
        if kind not in ("gpu", "host"):
            raise _err(sc, ev, f"{topo.nodes[nid].name} is a {kind}, not a GPU or host", key)
        return (nic_link(sc, ev, topo, nid),)
    return tuple(sorted(ch >> 1 for _, ch in topo.neighbours(nid)))


def nic_links(topo: Topology, nid: int) -> list[int]:
    """An endpoint's NICs: its links to (packet) switches, by link id."""
    return sorted(ch >> 1 for v, ch in topo.neighbours(nid) if topo.nodes[v].kind == "switch")


def nic_link(sc: Scenario, ev: NodeEvent, topo: Topology, nid: int) -> int:
    """The link of the NIC a nic_down takes: `nic` as an index among the endpoint's NICs, or its switch's name."""
    links, name = nic_links(topo, nid), topo.nodes[nid].name
    if not links:
        raise _err(sc, ev, f"{name} has no link to a switch (no NIC to fail)", "nic")
    if isinstance(ev.nic, int):
        if ev.nic >= len(links):
            raise _err(sc, ev, f"{name} has {len(links)} NIC(s) (nic = 0 .. {len(links) - 1}), got {ev.nic}", "nic")
        return links[ev.nic]
    for link in links:
        ends = topo.links[link].a, topo.links[link].b
        if any(topo.nodes[n].name == ev.nic for n in ends):
            return link
    raise _err(sc, ev, f"{name} has no NIC to a switch named {ev.nic!r}", "nic")


def check_against(sc: Scenario, topo: Topology) -> None:
    """Every name and rank of the scenario exists in `topo` (raises the first that does not)."""
    for ev in sc.events:
        if isinstance(ev, LinkEvent):
            link_id(sc, ev, topo)
        elif isinstance(ev, NodeEvent):
            node_links(sc, ev, topo)
        elif isinstance(ev, GpuSlow) and not 0 <= ev.rank < topo.num_ranks:
            raise _err(sc, ev, f"rank {ev.rank} is outside '{topo.name}' ({topo.num_ranks} ranks)", "rank")
        elif isinstance(ev, Background) and ev.hosts is not None:
            for h in ev.hosts:
                if h >= topo.num_ranks:
                    raise _err(sc, ev, f"rank {h} is outside '{topo.name}' ({topo.num_ranks} ranks)", "hosts")


def relocated(exc: InputError, sc: Scenario, ev: Event, key: str) -> InputError:
    """An error raised while using an event, moved to the event's file, line and field."""
    return relocate(InputError(exc.message, field=key), file=sc.source, line=ev.line, prefix=f"events[{ev.index}].")
