"""Parallel packet simulation across cut cables in worker processes (issue 38): start, wait, merge.

`run_partitioned` runs a batch of flows (`run_partitioned_batches`: batches each submitted at its own time, as `phantora
netsim` has them; dependencies name earlier flows, and a dependency completed in one worker releases its dependent in
another by a cut-link message) on `config.partition` worker processes (`bridge.cut_worker`) with a fresh token: local,
in a private run directory (0700), or with `config.ray` started by Ray actors (`bridge.cut_ray`, tcp, CurveZMQ beyond
loopback); the workers exchange their cut-link messages peer to peer (`bridge.cut_peers`), not through this process.
This process only waits: a worker that exits non-zero ends the run at once, the others killed (ours, by pid, or their
actors stopped), with an error naming it and its last words. The records of the workers are merged into one engine's:
completions by (end, flow id), as one engine drains them; FCT records, PFC frames, CE marks, CNPs, drops and trims in
one keyed engine's order, by the order key of the event that made each (`phantora.netsim.record_order`); transport
counters and channel counters added (each is counted by the worker that owns its end, zero elsewhere); queue samples
(each worker's of the switches it runs, one engine's instants) by (ns, node, port, class) (`merge_queue_samples`);
the counters of
`stats` added, its peaks and the fabric's constants the largest (`PEAK_STATS`), its settings (text) the first worker's,
and the switch links' load recomputed from the merged channels. A completion's start is its FCT record's (the sender's
worker starts the flow; its receiver's worker knows the start of a flow without dependencies only). The end of the run
(`now`) is one engine's after `finish()`: the last sender's last ACK, the latest FCT record's end.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgpack

from bridge.columns import completions_from_columns, flows_to_columns
from bridge.cut_watch import wait_workers
from bridge.ray_workers import last_words
from bridge.runspec import topology_to_dict
from bridge.transport import make_run_dir, new_token, remove_run_dir
from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.hpcc_io import FctLine
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FlowTransport,
    PfcEvent,
    QueueSample,
    Trim,
    switch_link_load,
)
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.record_order import RecordKey, merge_by_key, merge_queue_samples
from phantora.progress import Beat
from phantora.topology.model import Topology

# stats that are a peak or a property of the whole fabric in each worker: merged by the largest, not added
PEAK_STATS = frozenset(
    {"max_switch_buffer_bytes", "reorder_max_bytes", "int_enabled", "cc_base_rtt_ns", "cc_bdp_bytes"}
)
LINK_LOAD_STATS = ("switch_link_bytes_max", "switch_link_bytes_min", "switch_links_idle")  # from the channels
T = TypeVar("T")


@dataclasses.dataclass
class PartitionResult:
    """One engine's records, merged from the workers', and what each worker reported of its windows."""

    completions: list[Completion]
    fct: list[FctLine]
    pfc: list[PfcEvent]
    marks: list[EcnMark]
    cnps: list[CnpEvent]
    drops: list[Drop]
    trims: list[Trim]
    queues: list[QueueSample]  # one engine's queue samples (queue_sample_ns > 0), else empty
    transport: dict[int, FlowTransport]
    channels: list[tuple[int, ...]]
    stats: dict[str, Any]  # counters summed over the workers, PEAK_STATS their largest, settings the first's
    effective: list[tuple[str, str]]  # the first worker's EffectiveParams() pairs (EffectiveSettings.parse)
    now: int  # one engine's clock after finish(): the latest FCT record's end (0 without any)
    ties: int  # records of one ns after one from another worker: ordered by their events' keys (`merge_by_key`)
    workers: list[dict[str, Any]]  # per worker: windows, exchanges, CPU, wall, memory, cut stats
    wall_s: float


def _start(i: int, root: Path, setup: dict[str, Any], token: str) -> tuple[subprocess.Popen[bytes], Path]:
    d = root / f"w{i}"
    d.mkdir(mode=0o700)
    path = d / "setup.msgpack"
    path.write_bytes(msgpack.packb(setup))
    path.chmod(0o600)
    log = d / "worker.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cut_worker", "--setup", str(path)],
            env={**os.environ, "PHANTORA_TOKEN": token},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if setup.get("beat") else subprocess.DEVNULL,  # (its beats, `_Beats`)
            stderr=err,
        )
    return proc, log


def run_partitioned(
    topology: Topology, config: PacketConfig, flows: Sequence[Flow], until: int | None = None
) -> PartitionResult:
    """Run `flows` (all submitted at 0) on `config.partition` workers until `until` ns (every event at or before
    it) or, with None, until nothing is left anywhere."""
    return run_partitioned_batches(topology, config, [(0, flows)], until)


def run_partitioned_batches(
    topology: Topology,
    config: PacketConfig,
    batches: Sequence[tuple[int, Sequence[Flow]]],
    until: int | None = None,
    dports: Mapping[int, int] | None = None,
    to_last_completion: bool = False,
    on_beat: Callable[[Beat], None] | None = None,
    beat_s: float = 0.5,
) -> PartitionResult:
    """`run_partitioned` with each batch submitted at its own time (ns, as `Ns3Simulator.submit` takes it, all
    before the run starts); `dports` labels fct.txt records (flow id -> HPCC destination port);
    `to_last_completion` (with no `until`): the workers stop after the ns of the last completion, as one engine's
    drain (a replay), not at the last ACK (one engine's `finish()`, what netsim runs). `on_beat` (local workers): a
    progress display's, given the workers' beats from inside their window loops, merged (`_Beats`), at most every
    `beat_s`."""
    config = config.validate()
    n = config.partition
    if n < 1:
        raise ValueError("run_partitioned: set partition=N (N >= 1) in the config")
    token = new_token()
    wall0 = time.perf_counter()
    wire = [[at, flows_to_columns(batch)] for at, batch in batches]
    ports = sorted((dports or {}).items())
    setups = []
    for g in range(n):
        spec = EngineSpec(network="ns3", packet=config.with_updates(partition_worker=g), side="packet")
        setups.append({"topology": topology_to_dict(topology), "engine": spec.to_dict(), "batches": wire,
                       "dports": ports, "until": until, "finish": to_last_completion,
                       "beat": beat_s if on_beat is not None and not config.ray else 0.0})  # fmt: skip
    if config.ray:
        from bridge.cut_ray import run_on_ray

        outs = run_on_ray(config.ray, setups, token, config.partition_timeout_s)
    else:
        outs = _run_local(setups, token, config.partition_timeout_s, on_beat, beat_s)
    posts = {f.id: (at, f.deps, f.delay_ns) for at, batch in batches for f in batch if f.deps}
    res = _merge(outs, time.perf_counter() - wall0, topology, posts)
    res.stats["flows_submitted"] = sum(len(b) for _, b in batches)  # each worker counts the flows it has an end of
    return res


@dataclasses.dataclass
class _Local:
    proc: subprocess.Popen[bytes]
    log: Path

    def poll(self) -> int | None:
        return self.proc.poll()

    def describe(self) -> str:
        return f"pid {self.proc.pid}"

    def last_words(self) -> str:
        return last_words(self.log)


class _Beats:
    """The workers' beats (`bridge.cut_worker`: msgpack [clock ns, events, CPU ns] on its stdout pipe), read without
    waiting at each poll and passed on merged at most every `every_s`: the least clock (the workers run their
    windows together), the events and CPU seconds summed, the busiest worker (the most CPU)."""

    def __init__(
        self, procs: Sequence[subprocess.Popen[bytes]], on_beat: Callable[[Beat], None], every_s: float
    ) -> None:
        self.on_beat, self.every_s = on_beat, every_s
        self.fds = [p.stdout.fileno() if p.stdout is not None else -1 for p in procs]
        for fd in self.fds:
            if fd >= 0:
                os.set_blocking(fd, False)
        self.readers = [msgpack.Unpacker(raw=False, max_buffer_size=1 << 20) for _ in procs]
        self.last: list[list[int] | None] = [None] * len(procs)
        self.sent = float("-inf")

    def __call__(self) -> None:
        for i, fd in enumerate(self.fds):
            while fd >= 0:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    self.fds[i] = -1  # (it exited)
                    break
                self.readers[i].feed(chunk)
                for beat in self.readers[i]:
                    if isinstance(beat, list) and len(beat) == 3 and all(isinstance(x, int) for x in beat):
                        self.last[i] = beat
        got = [(i, b) for i, b in enumerate(self.last) if b is not None]
        now = time.monotonic()
        if not got or now - self.sent < self.every_s:
            return
        self.sent = now
        busiest = max(got, key=lambda ib: ib[1][2])[0]
        clock = min(b[0] for _, b in got)
        self.on_beat(Beat(clock, sum(b[1] for _, b in got), sum(b[2] for _, b in got) / 1e9, len(self.last), busiest))


def _run_local(
    setups: list[dict[str, Any]],
    token: str,
    timeout_s: float,
    on_beat: Callable[[Beat], None] | None = None,
    beat_s: float = 0.5,
) -> list[dict[str, Any]]:
    """Run the workers as local processes in a private run directory (ipc sockets); their outputs (`on_beat`: given
    their beats, `_Beats`)."""
    root = make_run_dir()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for g, setup in enumerate(setups):
            procs.append(_start(g, root, {**setup, "run_dir": str(root), "out": str(root / f"w{g}" / "out.msgpack")},
                                token))  # fmt: skip
        tick = None if on_beat is None else _Beats([p for p, _ in procs], on_beat, beat_s)
        _wait(procs, timeout_s, tick)
        return [msgpack.unpackb((root / f"w{g}" / "out.msgpack").read_bytes(), raw=False) for g in range(len(setups))]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        remove_run_dir(root)


def _wait(
    procs: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float, tick: Callable[[], None] | None = None
) -> None:
    """Wait for every local worker, at most `timeout_s`; the first to fail ends the run, named."""
    wait_workers([_Local(proc, log) for proc, log in procs], timeout_s, tick=tick)


def _merge(
    outs: list[dict[str, Any]],
    wall_s: float,
    topology: Topology,
    posts: Mapping[int, tuple[int, Sequence[int], int]] | None = None,
) -> PartitionResult:
    """The workers' outputs as one keyed engine's result. A completion's start is its sender's (its FCT record; a
    receiver's worker does not see a release made in another), or, for a flow whose sender's last ACK the run
    stopped before (a run to the last completion), one engine's: its post ns (`posts`: flow id -> (post ns, deps,
    delay), the flows with deps) or its last dependency's end, whichever is later, plus its delay."""
    ties = [0]
    fct = _merged(outs, "fct", FctLine, ties)
    starts = {r.flow_id: r.start_ns for r in fct}
    done = sorted((c for o in outs for c in completions_from_columns(o["done"])), key=lambda c: (c.end_ns, c.flow_id))
    ends = {c.flow_id: c.end_ns for c in done}
    for i, c in enumerate(done):
        start = starts.get(c.flow_id)
        if start is None and posts and c.flow_id in posts:
            at, deps, delay = posts[c.flow_id]
            start = max(at, *(ends[d] for d in deps)) + delay
        if start is not None and start != c.start_ns:
            done[i] = dataclasses.replace(c, start_ns=start)
    channels, stats = merged_counters(outs, topology)
    pfc = _merged(outs, "pfc", PfcEvent, ties)
    marks = _merged(outs, "marks", EcnMark, ties)
    cnps = _merged(outs, "cnps", CnpEvent, ties)
    drops = _merged(outs, "drops", Drop, ties)
    trims = _merged(outs, "trims", Trim, ties)
    now = max((r.start_ns + r.fct_ns for r in fct), default=0)
    queues = merge_queue_samples([[QueueSample(*r) for r in o.get("queues", ())] for o in outs])
    return PartitionResult(
        completions=done,
        fct=fct,
        pfc=pfc,
        marks=marks,
        cnps=cnps,
        drops=drops,
        trims=trims,
        queues=queues,
        transport=merged_transport(outs),
        channels=channels,
        stats=stats,
        effective=[(str(k), str(v)) for k, v in outs[0].get("effective", ())] if outs else [],
        now=now,
        ties=ties[0],
        workers=[o["windows"] for o in outs],
        wall_s=wall_s,
    )


def merged_transport(outs: Sequence[Mapping[str, Any]]) -> dict[int, FlowTransport]:
    """The workers' transport counters per flow, added (each counted by the worker of its end, zero elsewhere). A
    flow whose receiver had its last byte but whose sender's last ACK came after the run's stop has its sender's
    counters as one engine has them then, as of the last byte (`transport_tail`)."""
    transport: dict[int, list[int]] = {}
    for o in outs:
        for fid, *vals in o["transport"]:
            have = transport.setdefault(fid, [0, 0, 0, 0])
            have[:] = [a + b for a, b in zip(have, vals, strict=True)]
    for fid, (packets, nbytes) in senders_at_last_byte([o.get("transport_tail", ()) for o in outs]).items():
        have = transport[fid]  # (the receiver's worker recorded it at the last byte)
        have[0] += packets
        have[1] += nbytes
    return {fid: FlowTransport(fid, *v) for fid, v in sorted(transport.items())}


def senders_at_last_byte(tails: Sequence[Sequence[int]]) -> dict[int, tuple[int, int]]:
    """Flow id -> its sender's retransmitted (packets, bytes) as of its receiver's last byte, for the flows done at
    their receiver in one worker and not at their sender in another: one engine's record of such a flow takes the
    sender's counters at the last byte (`DataComplete`) and only later, at the last ACK, their final values.
    `tails`: each worker's `Ns3Simulator.cut_transport_tail()` (flat: [0, id, key of the last byte's event] per flow
    it received, [1, id, packets, bytes, n, n x (key, payload)] per flow it sends, its retransmissions since every
    byte was sent once); the sender's counters less those after the last byte's key (one engine's event order)."""
    last: dict[int, tuple[int, ...]] = {}
    sent: dict[int, tuple[int, int, list[tuple[tuple[int, ...], int]]]] = {}
    for flat in tails:
        i = 0
        while i < len(flat):
            kind, fid = flat[i], flat[i + 1]
            if kind == 0:
                last[fid] = tuple(flat[i + 2 : i + 6])
                i += 6
            else:
                n = flat[i + 4]
                marks = [(tuple(flat[j : j + 4]), flat[j + 4]) for j in range(i + 5, i + 5 + 5 * n, 5)]
                sent[fid] = (flat[i + 2], flat[i + 3], marks)
                i += 5 + 5 * n
    out = {}
    for fid, key in last.items():
        if fid in sent:
            packets, nbytes, marks = sent[fid]
            later = [payload for k, payload in marks if k > key]
            out[fid] = (packets - len(later), nbytes - sum(later))
    return out


def merged_counters(
    outs: Sequence[Mapping[str, Any]], topology: Topology
) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
    """The workers' channel counters (added: a sending port's are one worker's, zero in the others; the largest
    queue the largest) and `stats` as one engine's, the switch links' load from the merged channels."""
    channels: dict[int, list[int]] = {}
    for o in outs:
        for row in o["channels"]:
            if row[0] not in channels:
                channels[row[0]] = list(row)
            else:
                have = channels[row[0]]
                have[4:8] = [a + b for a, b in zip(have[4:8], row[4:8], strict=True)]
                have[8] = max(have[8], row[8])
    stats = _merged_stats([o["stats"] for o in outs])
    stats.update(switch_link_load(topology, {c: row[4] for c, row in channels.items()}))  # row[4]: bytes sent
    return [tuple(channels[c]) for c in sorted(channels)], stats


def _merged(outs: list[dict[str, Any]], name: str, make: Callable[..., T], ties: list[int]) -> list[T]:
    """The workers' records `name` as one keyed engine's list, by their events' order keys (ties counted)."""
    records = [[make(*r) for r in o.get(name, ())] for o in outs]
    keys: list[list[RecordKey]] = [[(k[0], k[1], k[2], k[3]) for k in o.get("keys", {}).get(name, ())] for o in outs]
    return merge_by_key(name, records, keys, ties)


def _merged_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' `stats` as one engine's: counters added, `PEAK_STATS` the largest, settings (anything not a
    number) the first worker's; the switch links' load is left to the caller (each worker counts only the
    channels it sends on)."""
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if k in LINK_LOAD_STATS:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                out.setdefault(k, v)
            else:
                out[k] = max(out.get(k, v), v) if k in PEAK_STATS else out.get(k, 0) + v
    return out
