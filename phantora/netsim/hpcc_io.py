"""HPCC RDMA-simulator file formats: the flow file (input), fct.txt and pfc.txt (outputs).

Flow file: the flow count, then ``<src> <dst> <priority_group> <dport> <size_bytes> <start_seconds>``
per line. fct.txt: ``<sip hex> <dip hex> <sport> <dport> <size_B> <start_ns> <fct_ns> <standalone_ns>``
(phantora appends its flow id as a ninth column when asked). pfc.txt: ``<time_ns> <node> <node_type>
<if_index> <type>`` with type 1 = pause, 0 = resume.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from phantora.errors import InputError, InputWarning
from phantora.files import read_text
from phantora.netsim.base import Flow
from phantora.topology.ecmp import HPCC_FIRST_SPORT, hpcc_ip, hpcc_port_key
from phantora.topology.model import ENDPOINT_KINDS, Topology

if TYPE_CHECKING:
    from phantora.netsim.observe import PfcEvent


@dataclass(frozen=True, slots=True)
class HpccFlow:
    """One line of an HPCC flow file."""

    index: int
    src: int
    dst: int
    priority: int
    dport: int
    size: int
    start_ns: int
    line: int
    sport: int = HPCC_FIRST_SPORT  # as HPCC assigns it: per source host, from 10000, one more per flow

    def to_flow(self) -> Flow:
        """The engine-neutral Flow: id = the line index, ECMP key = the port word ``sport | dport << 16``."""
        key = hpcc_port_key(self.sport, self.dport)
        return Flow(id=self.index, src=self.src, dst=self.dst, size=self.size, priority=self.priority, key=key)


@dataclass(frozen=True, slots=True)
class FctLine:
    """One line of an HPCC fct.txt."""

    src: int
    dst: int
    sport: int
    dport: int
    size: int
    start_ns: int
    fct_ns: int
    standalone_ns: int
    flow_id: int | None = None


node_ip = hpcc_ip  # HPCC's address of a node (third.cc node_id_to_ip)


def ip_node(ip: int) -> int:
    """The node id of an HPCC address (inverse of node_ip)."""
    off = ip - 0x0B000001
    return ((off >> 16) & 0xFF) * 256 + ((off >> 8) & 0xFF)


def _int(word: str, what: str, file: str, line: int, minimum: int = 0) -> int:
    try:
        value = int(word)
    except ValueError:
        raise InputError(f"{what}: expected an integer, got {word!r}", file=file, line=line, field=what) from None
    if value < minimum:
        raise InputError(f"{what}: must be >= {minimum}, got {value}", file=file, line=line, field=what)
    return value


def read_hpcc_flows(path: str | Path, topology: Topology | None = None) -> list[HpccFlow]:
    """Read an HPCC flow file; with a topology, check that src and dst are endpoints of it."""
    p = Path(path)
    name = str(p)
    text = read_text(p, "flow file")
    lines = [(no, ln.split("#", 1)[0].split()) for no, ln in enumerate(text.splitlines(), 1)]
    lines = [(no, words) for no, words in lines if words]
    if not lines:
        raise InputError("the flow file is empty", file=name)
    head_no, head = lines[0]
    if len(head) != 1:
        raise InputError(f"line 1 must be the flow count, got {len(head)} fields", file=name, line=head_no)
    count = _int(head[0], "flow count", name, head_no)
    body = lines[1:]
    if len(body) < count:
        raise InputError(f"the header announces {count} flows but {len(body)} follow", file=name, line=head_no)
    if len(body) > count:  # HPCC reads the announced count and ignores the rest (its example file has notes)
        warnings.warn(
            f"{name}:{head_no}: the header announces {count} flows; the {len(body) - count} lines after them "
            f"(from line {body[count][0]}) are ignored, as HPCC does",
            InputWarning,
            stacklevel=2,
        )
        body = body[:count]
    flows: list[HpccFlow] = []
    next_sport: dict[int, int] = {}  # third.cc: portNumder[src]++ as each flow starts, in file order
    for i, (no, words) in enumerate(body):
        if len(words) != 6:
            raise InputError(
                f"expected '<src> <dst> <priority_group> <dport> <size_bytes> <start_seconds>', "
                f"got {len(words)} fields",
                file=name,
                line=no,
            )
        src = _int(words[0], "src", name, no)
        dst = _int(words[1], "dst", name, no)
        if src == dst:
            raise InputError(f"a flow from node {src} to itself crosses no link", file=name, line=no, field="dst")
        prio = _int(words[2], "priority_group", name, no)
        if not 1 <= prio <= 7:
            raise InputError(
                f"priority group must be 1..7 (0 is the control class), got {prio}",
                file=name,
                line=no,
                field="priority_group",
            )
        dport = _int(words[3], "dport", name, no)
        if dport > 0xFFFF:
            raise InputError(f"dport must be a port, 0..65535, got {dport}", file=name, line=no, field="dport")
        size = _int(words[4], "size_bytes", name, no)
        try:
            start = Decimal(words[5]) * 10**9
        except InvalidOperation:
            raise InputError(
                f"start time: expected seconds, got {words[5]!r}", file=name, line=no, field="start_seconds"
            ) from None
        if start < 0 or start != start.to_integral_value():
            raise InputError(
                f"start time must be >= 0 and a whole number of ns, got {words[5]!r} s",
                file=name,
                line=no,
                field="start_seconds",
            )
        if topology is not None:
            for end, what in ((src, "src"), (dst, "dst")):
                if not 0 <= end < len(topology.nodes) or topology.nodes[end].kind not in ENDPOINT_KINDS:
                    raise InputError(
                        f"node {end} is not an endpoint of '{topology.name}'", file=name, line=no, field=what
                    )
        sport = next_sport.get(src, HPCC_FIRST_SPORT)
        if sport > 0xFFFF:
            raise InputError(f"host {src} starts more flows than it has source ports", file=name, line=no)
        next_sport[src] = sport + 1
        flows.append(HpccFlow(i, src, dst, prio, dport, size, int(start), no, sport))
    if any(b.start_ns < a.start_ns for a, b in zip(flows, flows[1:], strict=False)):
        bad = next(b for a, b in zip(flows, flows[1:], strict=False) if b.start_ns < a.start_ns)
        raise InputError("flows must be sorted by start time", file=name, line=bad.line, field="start_seconds")
    return flows


def format_fct_line(rec: FctLine, with_id: bool = False) -> str:
    """One fct.txt line (HPCC field order, hex addresses without 0x)."""
    out = (
        f"{node_ip(rec.src):08x} {node_ip(rec.dst):08x} {rec.sport} {rec.dport} {rec.size} "
        f"{rec.start_ns} {rec.fct_ns} {rec.standalone_ns}"
    )
    return f"{out} {rec.flow_id}" if with_id and rec.flow_id is not None else out


def write_fct_txt(records: Iterable[FctLine], dest: str | Path | TextIO, with_id: bool = True) -> None:
    """Write fct.txt lines in the given order (HPCC writes them in completion order)."""
    text = "".join(format_fct_line(r, with_id) + "\n" for r in records)
    if isinstance(dest, (str, Path)):
        Path(dest).write_text(text)
    else:
        dest.write(text)


def read_fct_txt(path: str | Path) -> list[FctLine]:
    """Read an HPCC fct.txt (8 fields, or 9 with phantora's flow id)."""
    name = str(path)
    out: list[FctLine] = []
    for no, raw in enumerate(Path(path).read_text().splitlines(), 1):
        words = raw.split()
        if not words:
            continue
        if len(words) not in (8, 9):
            raise InputError(f"expected 8 or 9 fields, got {len(words)}", file=name, line=no)
        try:
            sip, dip = int(words[0], 16), int(words[1], 16)
            nums = [int(w) for w in words[2:]]
        except ValueError:
            raise InputError("fields must be integers (addresses in hex)", file=name, line=no) from None
        sport, dport, size, start, fct, alone = nums[:6]
        flow_id = nums[6] if len(nums) > 6 else None
        out.append(FctLine(ip_node(sip), ip_node(dip), sport, dport, size, start, fct, alone, flow_id=flow_id))
    return out


@dataclass(frozen=True, slots=True)
class PfcLine:
    """One PFC frame as HPCC's pfc.txt reports it (at the port that is paused)."""

    time_ns: int
    node: int
    node_type: int  # 0 endpoint, 1 switch (2: NVSwitch, phantora only)
    if_index: int  # HPCC numbers ports from 1 (0 is the loopback device)
    pause: int  # 1 pause, 0 resume


def pfc_txt_lines(events: Iterable[PfcEvent]) -> list[PfcLine]:
    """PFC frames (`observe.PfcEvent`) as pfc.txt records: HPCC numbers ports from 1."""
    return [PfcLine(e.time_ns, e.node, e.node_type, e.port + 1, int(e.pause)) for e in events]


def write_pfc_txt(records: Sequence[PfcLine], dest: str | Path | TextIO) -> None:
    """Write pfc.txt lines."""
    text = "".join(f"{r.time_ns} {r.node} {r.node_type} {r.if_index} {r.pause}\n" for r in records)
    if isinstance(dest, (str, Path)):
        Path(dest).write_text(text)
    else:
        dest.write(text)
