"""Several jobs in one co-simulation: each job's ranks are numbered from 0 in its own world, the coordinator's
global rank of job j's rank r is ``offset_j + r`` (and the placed topology puts that rank on the job's GPU).

A rank says its job in its hello (``job``, from ``PHANTORA_JOB``); the coordinator translates the ranks its
requests name (group, root, peer) to global ones, refusing any outside the job, so a job's collectives never
meet another job's. Each job's flows carry its own ECMP keys (counted from 0 per job, as if the job ran
alone) and its traffic class.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.errors import RunFailed
from bridge.protocol import E_PROTOCOL, Message


@dataclass
class JobProcs:
    """One job's processes, for `bridge.run.CosimRun(jobs=...)`: every rank runs `cmd` with RANK, WORLD_SIZE,
    LOCAL_RANK ... of the job, PHANTORA_JOB and `env`."""

    name: str
    ranks: int
    cmd: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    priority: int | None = None  # traffic class of its flows


@dataclass(frozen=True)
class JobInfo:
    """One job as the coordinator sees it."""

    name: str
    offset: int  # its rank 0's global rank
    ranks: int  # its world size
    priority: int | None = None  # traffic class of its flows (None: the engine default)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "ranks": self.ranks, "priority": self.priority}


class JobTable:
    """The jobs of a run, in global rank order."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = [JobInfo(str(j["name"]), int(j["offset"]), int(j["ranks"]), j.get("priority")) for j in jobs]
        self._starts = [j.offset for j in self.jobs]
        expect = 0
        for j in self.jobs:
            if j.offset != expect or j.ranks < 1:
                raise ValueError(f"jobs must tile the global ranks in order; job {j.name!r} does not")
            expect += j.ranks
        self.world = expect

    def __len__(self) -> int:
        return len(self.jobs)

    def job_of(self, rank: int) -> int:
        """The job index of a global rank."""
        return bisect.bisect_right(self._starts, rank) - 1

    def ranks_of(self, job: int) -> range:
        j = self.jobs[job]
        return range(j.offset, j.offset + j.ranks)

    def label(self, rank: int) -> str:
        """'rank 3 of job b': a global rank as its job knows it."""
        j = self.jobs[self.job_of(rank)]
        return f"rank {rank - j.offset} of job {j.name}"

    def translate(self, msg: Message, job: int) -> None:
        """Rewrite a request's job ranks (group, root, peer) to global ranks, in place."""
        j = self.jobs[job]
        if j.offset == 0 and len(self.jobs) == 1:
            return
        f = msg.fields

        def glob(r: int, what: str) -> int:
            if not 0 <= r < j.ranks:
                text = f"job {j.name}: a {msg.type} names rank {r} as {what}, outside 0..{j.ranks - 1}"
                raise RunFailed(E_PROTOCOL, text)
            return j.offset + r

        if msg.type == "coll":
            f["group"] = [glob(r, "a group member") for r in f["group"]]
            if f["root"] is not None:
                f["root"] = glob(f["root"], "the root")
        elif msg.type in ("p2p", "handoff"):
            peers = f.get("any")  # a recv from any source: its candidates' [rank, pg] pairs, no peer
            if isinstance(peers, list) and all(isinstance(p, list) and len(p) == 2 and _rank(p[0]) for p in peers):
                f["any"] = [[glob(p[0], "a source"), p[1]] for p in peers]
            else:
                f["peer"] = glob(f["peer"], "the peer")
            comm = f.get("comm")  # a grouped transfer's (or an eager-init lone send's) communicator
            if isinstance(comm, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in comm):
                f["comm"] = [glob(r, "a communicator member") for r in comm]
        elif msg.type == "plans":  # a group end: its communicator and its p2p ops' peers
            f["comm"] = [glob(r, "a communicator member") for r in f["comm"]]
            f["ops"] = [[glob(op[0], "a peer"), *op[1:]] if isinstance(op, list) and op else op for op in f["ops"]]
        elif msg.type in ("value", "values"):
            f["group"] = [glob(r, "a group member") for r in f["group"]]


def _rank(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
