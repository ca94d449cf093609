"""A replay rank's share of a workload: which ops it issues when, as `phantora.egraph.replay_rank` runs it through the
bridge, and as `phantora.replay_groups` re-enacts it against an in-process run.

Rank r issues op B at max(B.at, max over A in B.after (with r in A) of done_r(A) + B.gap), the rule of
`phantora.workload`, in time order: before issuing at t it waits (with deadline t) on the ops whose completion could
make an earlier issue time, so its clock never goes back. An all_to_all's `splits` transfers are one NCCL group
launch a rank, issued together with no wait between, as a live rank sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from phantora.workload import Workload, WorkloadOp


class NeverIssuedError(RuntimeError):
    """Every op left waits on ops that never end on this rank."""


class Calls(Protocol):
    """What a replay rank asks of the coordinator (`bridge.client.RankClient`; `phantora.replay_groups` answers it from
    an in-process run)."""

    @property
    def clock(self) -> int: ...

    def p2p_group(self, comm: Sequence[int] | None) -> None: ...

    def p2p(self, *, peer: int, is_send: bool, tag: int, seq: int, nbytes: int, t_issue_ns: int, name: str,
            launch: int | None) -> int: ...  # fmt: skip

    def collective(self, *, group: Sequence[int], seq: int, kind: str, nbytes: int, dtype: str, root: int | None,
                   t_issue_ns: int, name: str, algo: dict[str, Any] | None, redop: str) -> int: ...  # fmt: skip

    def wait_any(self, handles: Sequence[int], until_ns: int | None = None) -> tuple[int, int] | None: ...

    def wait(self, handle: int) -> int: ...


class ReplayRank:
    """The ops of one rank and what is known about them."""

    def __init__(self, wl: Workload, rank: int) -> None:
        self.rank = rank
        self.ops = [op for op in wl.ops if rank in op.coll.ranks]
        members = {op.name: op.coll.ranks for op in wl.ops}
        self.deps = {op.name: [a for a in op.after if rank in members[a]] for op in self.ops}
        self.seq: dict[str, int] = {}
        counters: dict[tuple[Any, ...], int] = {}
        for op in wl.ops:  # every member counts the same ops in the same order
            key = op.coll.ranks if op.coll.kind != "send_recv" else ("p2p", *op.coll.ranks)
            self.seq[op.name] = counters.get(key, 0)
            counters[key] = self.seq[op.name] + 1
        self.launch = {g: i for i, g in enumerate(dict.fromkeys(op.group for op in self.ops if op.group))}
        self.handle: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.issued: dict[str, int] = {}

    def issue_time(self, op: WorkloadOp) -> int | None:
        """When this rank issues op, or None while a dep's completion is unknown."""
        deps = self.deps[op.name]
        if any(a not in self.done for a in deps):
            return None
        if not deps and not op.gap_ns:
            return op.at_ns
        return max(op.at_ns, max((self.done[a] for a in deps), default=0) + op.gap_ns)

    def issue(self, client: Calls, op: WorkloadOp, t: int) -> None:
        coll = op.coll
        if coll.kind == "send_recv":
            src, dst = coll.ranks
            is_send = self.rank == src
            grouped = bool(op.group and coll.comm)  # a transfer of an all_to_all with splits: one NCCL group
            if grouped:
                client.p2p_group(coll.comm)
            h = client.p2p(
                peer=dst if is_send else src,
                is_send=is_send,
                tag=0,
                seq=self.seq[op.name],
                nbytes=coll.nbytes,
                t_issue_ns=t,
                name=op.name,
                launch=self.launch.get(op.group) if grouped else None,
            )
            if grouped:
                client.p2p_group(None)
        else:
            h = client.collective(
                group=coll.ranks,
                seq=self.seq[op.name],
                kind=coll.kind,
                nbytes=coll.nbytes,
                dtype=coll.dtype,
                root=coll.ranks[coll.root] if coll.root is not None else None,
                t_issue_ns=t,
                name=op.name,
                algo=dict(op.algo) or None,  # the op's own fields; the coordinator applies them over the run's
                redop=coll.redop,
            )
        self.handle[op.name] = h
        self.issued[op.name] = t

    def run(self, client: Calls) -> dict[str, Any]:
        """Issue every op in time order, then wait for all of them; return per-op times."""
        pending = list(self.ops)
        name_of: dict[int, str] = {}
        while pending:
            ready = [(t, i) for i, op in enumerate(pending) if (t := self.issue_time(op)) is not None]
            deps = {a for op in pending for a in self.deps[op.name]}
            waiting = sorted(self.handle[a] for a in deps if a not in self.done and a in self.handle)
            if ready:
                t, i = min(ready)
                t = max(t, client.clock)  # window mode may deliver a completion late
                if waiting:
                    got = client.wait_any(waiting, until_ns=t)
                    if got is not None:
                        self.done[name_of[got[0]]] = got[1]
                        continue
                op = pending[i]
                batch = [p for p in pending if p is op or (op.group and p.group == op.group)]
                pending = [p for p in pending if p not in batch]
                for b in batch:  # an NCCL group's transfers go at once, as a live rank's group launch (ncclGroupEnd)
                    self.issue(client, b, t)
                    name_of[self.handle[b.name]] = b.name
            else:
                got = client.wait_any(waiting) if waiting else None
                if got is None:
                    raise NeverIssuedError(f"rank {self.rank}: ops {[op.name for op in pending]} can never be issued")
                self.done[name_of[got[0]]] = got[1]
        for op in self.ops:
            if op.name not in self.done:
                self.done[op.name] = client.wait(self.handle[op.name])
        return {"issued": self.issued, "done": self.done}
