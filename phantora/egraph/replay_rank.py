"""A rank process that replays its share of a workload file through `RankClient` (no torch).

    python -m phantora.egraph.replay_rank WORKLOAD.toml

It issues its ops as `phantora.replay_ranks.ReplayRank` says (the rule of `phantora.workload`, in time order; the
transfers of an all_to_all with `splits` as one NCCL group launch a rank on the group's communicator, issued
together). Collectives are matched by (group, seq) with seq counted per group in workload order; a send_recv op
becomes a send on its src and a recv on its dst. At the end it reports per-op issue and done times.

Exit codes: 0 done, 2 bad input, 3 the run failed (the diagnostic is printed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bridge.errors import BridgeError
from phantora.errors import PhantoraError
from phantora.replay_ranks import NeverIssuedError, ReplayRank
from phantora.workload import as_job, load_workload, step_of

__all__ = ["ReplayRank", "main", "step_results"]


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
    from bridge.client import RankClient

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
    except (BridgeError, NeverIssuedError) as exc:
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
