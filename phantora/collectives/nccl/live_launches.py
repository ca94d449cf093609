"""How many kernels a live rank's NCCL group of p2p operations launches, so its host pays a launch for each.

At ncclGroupEnd each rank plans its own p2p operations (enqueue.cc `scheduleP2pTasksToPlan`, v2.22.3-1 ..
v2.30.7-1) and launches every plan it cut them into, one kernel each, one after another (`ncclLaunchKernel` per
plan). Which plans a rank cuts depends on its own operations only: its rounds, each operation's channels and NCCL's
plan budget (`p2p_plans.rank_plans`). The rank asks the coordinator at its group's end (it does not hold the
topology); the same cut decides when the coordinator runs each operation (`nccl._live_plans`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from phantora.collectives.nccl import comm_hosts, p2p_plans, settings
from phantora.collectives.nccl.p2p import transfer_layout
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.tuning import running_release
from phantora.collectives.spec import AlgoOptions
from phantora.topology.model import Topology

Op = tuple[int, int, bool]  # (peer's global rank, bytes, is a send)


def rank_launches(
    topo: Topology, algo: AlgoOptions, over: Mapping[str, Any], rank: int, comm: Sequence[int], ops: Sequence[Op]
) -> int:
    """The kernels global `rank` launches for its group `ops` (in issue order) on communicator `comm` (global ranks,
    in order), under the run's `algo` with the group's overrides `over` (its NCCL_* variables): 1 where NCCL's model
    does not apply (the ideal model), before 2.22, or where no peer has more than one operation (as the coordinator
    cuts, `nccl._live_plans`)."""
    keep = {k: v for k, v in over.items() if k not in ("traffic_class", "loss_tolerance")}
    opts = dataclasses.replace(algo, **keep) if keep else algo
    if opts.model != "nccl" or len(comm) < 2 or rank not in comm:
        return 1
    st = settings(opts)
    if st.nccl_version < p2p_plans.PLANS_FROM:
        return 1
    at = {r: i for i, r in enumerate(comm)}
    me = at[rank]
    sizes: dict[tuple[int, int], list[int]] = {}
    for peer, nbytes, is_send in ops:
        if peer not in at:
            continue
        sizes.setdefault((me, at[peer]) if is_send else (at[peer], me), []).append(nbytes)
    if all(len(v) < 2 for v in sizes.values()):
        return 1
    from phantora.collectives.nccl.p2p_group import plan_parts  # numpy: kept off the netsim CLI's start-up

    on = platform_of(topo, tuple(comm), st)
    hosts = comm_hosts(topo, tuple(comm), st)
    protocol = opts.protocol if opts.protocol in ("LL", "LL128", "Simple") else "auto"
    chans = {
        pair: tuple(plan_parts(on, st, hosts, {pair: n}, protocol)[pair].channels for n in each)
        for pair, each in sizes.items()
    }
    release = running_release(st)
    rules = p2p_plans.batch_rules(release, st.p2p_epoch)
    most = transfer_layout(on, st).most
    resume = p2p_plans.resumes(release)
    return p2p_plans.rank_plans(hosts, me, chans, most, resume, rules, release, st.p2p_sched_group)
