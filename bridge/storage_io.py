"""The coordinator's checkpoint transfers: each rank's file reads and writes on the shared storage.

A rank that reads or writes a checkpoint file sends ``io`` (its bytes, read or write, and the run's storage
bandwidths: `phantora run --storage GBPS [--shared-fs GBPS]`) and waits on the handle. The transfer runs on
`bridge.storage_engine` from the rank's time, sharing its host's link and the shared filesystem max-min with
every other transfer in flight. Under rank deduplication a live rank stands for its mirrors, each of which
writes its own file on its own host at the same time: a transfer is started for each, and the live rank's
handle completes with its own. A request is checked when it arrives but held (`hold`) until the coordinator
starts what it holds (`start_held`, once every rank is blocked), by (time, rank, handle): the transfers' ids
and records do not depend on the order the ranks' requests arrived in.
"""

from __future__ import annotations

from typing import Any

from bridge.errors import RunFailed
from bridge.protocol import E_PROTOCOL, Message
from bridge.storage_engine import StorageEngine
from phantora.collectives.mirrors import Mirrors
from phantora.netsim.base import Completion
from phantora.topology.model import Topology


class StorageIO:
    """Transfers by id (negative), whose handle each is, and their records for the outcome."""

    def __init__(self, topology: Topology, mirrors: Mirrors) -> None:
        self.topology, self.mirrors = topology, mirrors
        self.engine: StorageEngine | None = None  # made at the first transfer, with the bandwidths it names
        self.owner: dict[int, tuple[int, int]] = {}  # transfer id -> (rank, handle) waiting on it
        self.of: dict[tuple[int, int], int] = {}  # (rank, handle) -> transfer id, until it is done
        self.records: list[dict[str, Any]] = []  # transfer -id-1 -> what it was and when it ran
        self.held: list[tuple[int, int, int, Message]] = []  # (start, rank, handle, request) not started yet

    def _host(self, rank: int) -> int:
        node = self.topology.node_of_rank(rank)
        host = self.topology.nodes[node].host
        return node if host is None else host

    def _engine(self, rank: int, msg: Message) -> StorageEngine:
        host_bps, shared = float(msg["host_bps"]), msg["shared_bps"]
        shared_bps = None if shared is None else float(shared)
        if self.engine is None:
            try:
                self.engine = StorageEngine(host_bps, shared_bps)
            except ValueError as exc:
                raise RunFailed(E_PROTOCOL, f"rank {rank}: {exc}") from None
        elif (self.engine.host_bps, self.engine.shared_bps) != (host_bps, shared_bps):
            raise RunFailed(
                E_PROTOCOL,
                f"rank {rank} names storage bandwidths host {host_bps:g} B/s, shared {shared_bps} B/s; an earlier "
                f"transfer named host {self.engine.host_bps:g} B/s, shared {self.engine.shared_bps} B/s (one storage "
                "per run: the ranks' PHANTORA_STORAGE_GBPS and PHANTORA_SHARED_FS_GBPS must agree)",
            )
        return self.engine

    def hold(self, rank: int, msg: Message, at: int) -> None:
        """Check rank's transfer `msg` and keep it, to start at `at` with `start_held`."""
        kind, nbytes = msg["kind"], msg["nbytes"]
        if kind not in ("read", "write") or nbytes < 0:
            raise RunFailed(
                E_PROTOCOL,
                f"rank {rank}: a storage transfer is a read or a write of >= 0 bytes, got {kind!r} of {nbytes} B",
            )
        self._engine(rank, msg)
        self.held.append((at, rank, msg["h"], msg))

    def start_held(self) -> list[tuple[int, int]]:
        """Start the held transfers by (start, rank, handle); return each (id, earliest completion)."""
        held, self.held = sorted(self.held, key=lambda x: x[:3]), []
        return [out for at, rank, _, msg in held for out in self._start(rank, msg, at)]

    def _start(self, rank: int, msg: Message, at: int) -> list[tuple[int, int]]:
        """Start rank's transfer `msg` (and its mirrors') at `at`; return each (id, earliest completion)."""
        kind, nbytes = msg["kind"], msg["nbytes"]
        engine = self._engine(rank, msg)
        out = []
        for j in range(self.mirrors.shifts):
            who = self.mirrors.shift(rank, j)
            tid = -1 - len(self.records)
            engine.start(tid, who, self._host(who), nbytes, at, msg["name"])
            self.records.append({"rank": who, "kind": kind, "bytes": nbytes, "name": msg["name"], "start_ns": at})
            out.append((tid, at + engine.lone_ns(nbytes)))
            if j == 0:
                self.owner[tid] = (rank, msg["h"])
                self.of[(rank, msg["h"])] = tid
        return out

    def done(self, c: Completion) -> tuple[int, int] | None:
        """Transfer `c` ended: record it; the (rank, handle) it completes, if a rank waits on it."""
        self.records[-1 - c.flow_id]["end_ns"] = c.end_ns
        mine = self.owner.pop(c.flow_id, None)
        if mine is not None:
            del self.of[mine]
        return mine

    def outcome(self) -> dict[str, Any]:
        """The transfers for results ({} when none ran)."""
        return {"storage_io": self.records} if self.records else {}
