"""A rank process that replays its share of a workload file through `RankClient` (no torch).

    python -m phantora.egraph.replay_rank WORKLOAD.toml

Rank r issues op B at max(B.at, max over A in B.after (with r in A) of done_r(A) + B.gap), the rule
of `phantora.workload`, in time order: before issuing at t it waits (with deadline t) on the ops
whose completion could make an earlier issue time, so its clock never goes back. Collectives are
matched by (group, seq) with seq counted per group in workload order; a send_recv op becomes a
send on its src and a recv on its dst (the transfers of an all_to_all with `splits` in one NCCL group on the group's
communicator, one launch a rank, as a live rank sends them). At the end it reports per-op issue and done times.

Exit codes: 0 done, 2 bad input, 3 the run failed (the diagnostic is printed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bridge.client import RankClient
from bridge.errors import BridgeError
from phantora.errors import PhantoraError
from phantora.workload import Workload, WorkloadOp, as_job, load_workload, step_of


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

    def issue(self, client: RankClient, op: WorkloadOp, t: int) -> None:
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

    def run(self, client: RankClient) -> dict[str, Any]:
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
                op = pending.pop(i)
                self.issue(client, op, t)
                name_of[self.handle[op.name]] = op.name
            else:
                got = client.wait_any(waiting) if waiting else None
                if got is None:
                    raise BridgeError(f"rank {self.rank}: ops {[op.name for op in pending]} can never be issued")
                self.done[name_of[got[0]]] = got[1]
        for op in self.ops:
            if op.name not in self.done:
                self.done[op.name] = client.wait(self.handle[op.name])
        return {"issued": self.issued, "done": self.done}


def step_results(done: dict[str, int], rank: int, world: int, start_ns: int) -> dict[str, Any]:
    """What a training rank reports of its steps: each step ends when the rank's last op of it is done."""
    ends: dict[int, int] = {}
    for name, t in done.items():
        k = step_of(name)
        ends[k] = max(ends.get(k, start_ns), t)
    return {
        "rank": rank,
        "world_size": world,
        "start_ns": start_ns,
        "end_ns": max(ends.values(), default=start_ns),
        "step_ends_ns": [ends[k] for k in sorted(ends)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m phantora.egraph.replay_rank", description=__doc__)
    p.add_argument("workload", help="a workload file (.toml or .json)")
    p.add_argument("--start", type=int, default=0, metavar="NS", help="the job starts at this time (ns)")
    p.add_argument("--steps", type=int, default=None, help="repeat the workload as this many training steps")
    args = p.parse_args(argv)
    try:
        client = RankClient.from_env()
    except BridgeError as exc:
        print(f"replay rank: {exc}", file=sys.stderr)
        return 3
    try:
        wl = as_job(load_workload(args.workload, world=client.world), args.steps, args.start)
        out = ReplayRank(wl, client.rank).run(client)
        out.update(step_results(out["done"], client.rank, client.world, args.start))
        client.finish(max([client.clock, *out["done"].values()]), out)
    except BridgeError as exc:
        print(f"replay rank {client.rank}: {exc}", file=sys.stderr)
        return 3
    except PhantoraError as exc:
        print(f"replay rank {client.rank}: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
