"""Parallel packet simulation across cut cables in worker processes (issue 38): start, wait, merge.

`run_partitioned` runs a batch of flows (no dependencies: each flow's start is known) on `config.partition`
worker processes (`bridge.cut_worker`), local, in a private run directory (0700) with a fresh token; the
workers exchange their cut-link messages peer to peer (`bridge.cut_peers`), not through this process. This
process only waits: a worker that exits non-zero ends the run at once, the others killed (ours, by pid), with
an error naming it and its last words. The records of the workers are merged into one engine's: completions,
FCT records, PFC frames, CE marks and CNPs sorted; transport counters and channel counters added (each is
counted by the worker that owns its end, zero elsewhere); the counters of `stats` added, its peaks and the
fabric's constants the largest (`PEAK_STATS`), and the switch links' load recomputed from the merged channels.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

from bridge.columns import completions_from_columns, flows_to_columns
from bridge.runspec import topology_to_dict
from bridge.transport import make_run_dir, new_token, remove_run_dir
from phantora.netsim.base import Completion, Flow
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.hpcc_io import FctLine
from phantora.netsim.observe import CnpEvent, EcnMark, FlowTransport, PfcEvent, switch_link_load
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology

RUN_TIMEOUT_S = 3600.0
# stats that are a peak or a property of the whole fabric in each worker: merged by the largest, not added
PEAK_STATS = frozenset(
    {"max_switch_buffer_bytes", "reorder_max_bytes", "int_enabled", "cc_base_rtt_ns", "cc_bdp_bytes"}
)
LINK_LOAD_STATS = ("switch_link_bytes_max", "switch_link_bytes_min", "switch_links_idle")  # from the channels


@dataclasses.dataclass
class PartitionResult:
    """One engine's records, merged from the workers', and what each worker reported of its windows."""

    completions: list[Completion]
    fct: list[FctLine]
    pfc: list[PfcEvent]
    marks: list[EcnMark]
    cnps: list[CnpEvent]
    transport: dict[int, FlowTransport]
    channels: list[tuple[int, ...]]
    stats: dict[str, float]  # counters summed over the workers, PEAK_STATS their largest
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
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return proc, log


def _last_words(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
    return ("; its last words: " + " | ".join(lines)) if lines else ""


def run_partitioned(
    topology: Topology, config: PacketConfig, flows: Sequence[Flow], until: int | None = None
) -> PartitionResult:
    """Run `flows` (all submitted at 0, no dependencies) on `config.partition` workers until `until` ns (every
    event at or before it) or, with None, until nothing is left anywhere."""
    config = config.validate()
    n = config.partition
    if n < 1:
        raise ValueError("run_partitioned: set partition=N (N >= 1) in the config")
    root = make_run_dir()
    token = new_token()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    wall0 = time.perf_counter()
    try:
        cols = flows_to_columns(flows)
        for g in range(n):
            spec = EngineSpec(network="ns3", packet=config.with_updates(partition_worker=g), side="packet")
            setup = {"topology": topology_to_dict(topology), "engine": spec.to_dict(), "flows": cols,
                     "until": until, "run_dir": str(root), "out": str(root / f"w{g}" / "out.msgpack")}  # fmt: skip
            procs.append(_start(g, root, setup, token))
        _wait(procs)
        outs = [msgpack.unpackb((root / f"w{g}" / "out.msgpack").read_bytes(), raw=False) for g in range(n)]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        remove_run_dir(root)
    res = _merge(outs, time.perf_counter() - wall0, topology)
    res.stats["flows_submitted"] = len(flows)  # each worker counts the flows it has an end of
    return res


def _wait(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """Wait for every worker; the first to fail ends the run, named."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    pending = set(range(len(procs)))
    while pending:
        for i in sorted(pending):
            proc, log = procs[i]
            code = proc.poll()
            if code is None:
                continue
            if code != 0:
                raise WorkerDiedError(
                    f"partition worker {i} (pid {proc.pid}) exited with code {code}{_last_words(log)}"
                )
            pending.discard(i)
        if time.monotonic() > deadline:
            raise WorkerDiedError(f"partition workers {sorted(pending)} still running after {RUN_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def _merge(outs: list[dict[str, Any]], wall_s: float, topology: Topology) -> PartitionResult:
    done = sorted((c for o in outs for c in completions_from_columns(o["done"])), key=lambda c: (c.end_ns, c.flow_id))
    transport: dict[int, list[int]] = {}
    for o in outs:
        for fid, *vals in o["transport"]:
            have = transport.setdefault(fid, [0, 0, 0, 0])
            have[:] = [a + b for a, b in zip(have, vals, strict=True)]
    channels: dict[int, list[int]] = {}
    for o in outs:
        for row in o["channels"]:
            if row[0] not in channels:
                channels[row[0]] = list(row)
            else:
                have = channels[row[0]]  # counters of the sending port: one worker's, zero in the others
                have[4:8] = [a + b for a, b in zip(have[4:8], row[4:8], strict=True)]
                have[8] = max(have[8], row[8])
    stats = _merged_stats([o["stats"] for o in outs])
    stats.update(switch_link_load(topology, {c: row[4] for c, row in channels.items()}))  # row[4]: bytes sent
    return PartitionResult(
        completions=done,
        fct=sorted((FctLine(*r) for o in outs for r in o["fct"]), key=dataclasses.astuple),
        pfc=sorted((PfcEvent(*r) for o in outs for r in o["pfc"]), key=dataclasses.astuple),
        marks=sorted((EcnMark(*r) for o in outs for r in o["marks"]), key=dataclasses.astuple),
        cnps=sorted((CnpEvent(*r) for o in outs for r in o["cnps"]), key=dataclasses.astuple),
        transport={fid: FlowTransport(fid, *v) for fid, v in sorted(transport.items())},
        channels=[tuple(channels[c]) for c in sorted(channels)],
        stats=stats,
        workers=[o["windows"] for o in outs],
        wall_s=wall_s,
    )


def _merged_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """The workers' `stats` as one engine's: counters added, `PEAK_STATS` the largest; the switch links' load is
    left to the caller (each worker counts only the channels it sends on)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            if k in LINK_LOAD_STATS:
                continue
            out[k] = max(out.get(k, v), v) if k in PEAK_STATS else out.get(k, 0) + v
    return out
