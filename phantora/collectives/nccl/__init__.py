"""Collectives as NCCL runs them: its algorithm x protocol choice, channels, latency and per-channel throughput.

`choose(coll, topo, opts)` is the one entry point `collectives.decompose` calls: the `Choice` NCCL's cost model
makes for this collective on this topology (see docs/collectives.md "NCCL model"), or None when the model does not
apply (the ideal model, a group of one). `shape.py` then turns the choice into what the flows carry.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from phantora.collectives.flow_tags import record_kind
from phantora.collectives.launch_group import LaunchGroup, shared
from phantora.collectives.layout import host_blocks, ring_order
from phantora.collectives.nccl import coll_group, fifo_budget, p2p_plans, pci_paths
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.ce_coll import ce_choice
from phantora.collectives.nccl.channels import comm_channels, nvls_heads, ring_graph
from phantora.collectives.nccl.chunking import chunk_bytes, comm_p2p_chunk, ring_simple_chunk
from phantora.collectives.nccl.in_turn import as_pass, in_turn
from phantora.collectives.nccl.node_p2p import gpu_name, node_pair_rates
from phantora.collectives.nccl.nvlink_pci import p2p_off
from phantora.collectives.nccl.p2p import p2p_choice, transfer_layout
from phantora.collectives.nccl.p2p_calls import grouped_calls
from phantora.collectives.nccl.pci_p2p import group_ends
from phantora.collectives.nccl.platform import Platform, nccl_view, platform_of
from phantora.collectives.nccl.redop import least_preferred, skipped
from phantora.collectives.nccl.register import (
    efficiency_nvls,
    p2p_zero_copy,
    register_mode,
    registered_chunk,
    registered_nvls,
    registered_nvls_ctas,
    sym_choice,
)
from phantora.collectives.nccl.ring_kernel import RING_CHUNK_STEPS
from phantora.collectives.nccl.settings import NcclSettings, nccl_env, settings_from_env, settings_of
from phantora.collectives.nccl.tuning import Choice, running_release, select
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.topology.model import Topology

# phantora's algorithm names <-> NCCL's, per kind (broadcast and reduce run NCCL's ring as a chain)
TO_NCCL = {"ring": "ring", "chain": "ring", "tree": "tree", "nvls": "nvls", "nvls_tree": "nvls_tree", "pat": "pat"}


def settings(opts: AlgoOptions) -> NcclSettings:
    """The NCCL settings of `opts`: its recorded NCCL_* variables, or this process's environment."""
    return settings_from_env() if opts.nccl_env is None else settings_of(opts.nccl_env)


def with_nccl_env(opts: AlgoOptions, env: Mapping[str, str] | None = None) -> AlgoOptions:
    """`opts` with its NCCL_* variables fixed: kept if it has them, else read from this process's environment
    overlaid with `env` (a run's or job's own variables, which its ranks see). What a run records and replays."""
    if opts.nccl_env is not None:
        return opts
    merged = {**os.environ, **(env or {})}
    return dataclasses.replace(opts, nccl_env=nccl_env(merged))


def choose(coll: Collective, topo: Topology, opts: AlgoOptions) -> Choice | None:
    """NCCL's choice for `coll`, restricted to `opts.algorithm` / `opts.protocol` when they are not auto."""
    if opts.model != "nccl" or coll.size < 2 or coll.kind == "barrier":
        return None
    st = settings(opts)
    p = platform_of(topo, coll.ranks, st)
    check_transports(p, st)
    view = nccl_view(topo, coll.comm or coll.ranks, st)
    if view is not topo or p.node_bw:  # NCCL nodes of NVLink hosts with P2P off: SHM inside, NET between
        got = _choose(coll, topo, opts, st, p)
        return None if got is None else _net_transports(got, coll, view, topo)
    return _choose(coll, topo, opts, st, p)


def _choose(coll: Collective, topo: Topology, opts: AlgoOptions, st: NcclSettings, p: Platform) -> Choice | None:
    """`choose` on the platform `p` of `coll`'s ranks under the settings `st`."""
    if opts.algorithm == "auto" and opts.protocol == "auto":
        ce = ce_choice(coll, p, st)  # NCCL's copy engines, ahead of its tuner and symmetric kernels (ce_coll.py)
        if ce is not None and coll.group_calls > 1:
            raise InputError("copy-engine collectives in a group of several calls are not modelled", field="-m")
        if ce is not None:
            return ce
    if coll.kind in ("all_to_all", "send_recv"):
        if opts.algorithm not in ("auto", "direct"):
            return None  # pairwise rounds: phantora's own, under the ideal model
        comm = comm_platform(coll, topo, st) if coll.comm else None
        grouped = coll.in_flight is not None
        if comm is not None and comm.pci is None and comm.intra == "nvlink" and p.intra == "nvlink" and grouped:
            got = _grouped(coll, topo, comm, st, opts.protocol)  # its NCCL group's
            got = _p2p_registered(got, p, comm, st)
            return grouped_calls(got, coll.group_calls, _p2p_plans(coll, comm, st, got))
        on = p if comm is None or comm.pci is None or p.pci is None else _with_comm_gpus(p, comm.pci.comm_gpus)
        nodes = tuple(topo.node_of_rank(r) for r in coll.ranks)

        def alone(c: Collective) -> Choice:  # `c` rated with its group's pairs in flight (a PCIe host, SHM pairs)
            group = _inflight(c) if comm is not None and comm.pci is not None and on.pci is not None else ()
            at = _inflight_at(c) if group else {}
            return p2p_choice(c, on, st, opts.protocol, comm, nodes, group, at, _node_shm(c, topo, p, comm, st))

        if coll.launch is not None and coll.launch.later:  # a pair's operations in turn (in_turn.py)
            key = ("in turn", coll.kind, coll.ranks, coll.comm, st, opts.protocol)  # each pass once for the pair

            def rate(k: int, g: LaunchGroup, _: int, nbytes: int) -> Choice:
                return shared(coll.launch, topo, (*key, k), lambda: alone(as_pass(coll, g, nbytes)))

            got = in_turn(coll, rate, _pair_plans(coll, topo, comm, st, opts.protocol))
        else:
            got = alone(coll)
        got = _p2p_registered(_with_transports(got, on, coll.kind), p, comm or p, st)
        return grouped_calls(got, coll.group_calls, _p2p_plans(coll, on, st, got))  # -m's calls, in turn a peer
    if opts.algorithm == "auto" and opts.protocol == "auto" and _sym_op(coll):
        sym = sym_choice(coll, p, st)  # -R 2: NCCL's symmetric kernels bypass its tuner (register.py)
        if sym is not None:
            return sym
    calls, pipe = 1, 1
    sizes = call_sizes(coll)
    if len(sizes) > 1 and coll.kind in coll_group.KINDS:  # NCCL's legacy kernels on the group's aggregate
        calls, pipe = len(sizes), _group_pipe_ops(coll, sizes, p, st)
        coll = dataclasses.replace(coll, nbytes=sum(sizes), group_calls=1, group_sizes=())
    elif coll.plan_sizes and coll.kind in coll_group.KINDS:  # a lone call, an aggregate of a group of more
        pipe = _group_pipe_ops(coll, (coll.nbytes,), p, st)
    skip = {a for a in skipped(coll.kind, coll.redop, coll.dtype, st.nccl_version) if st.algo_enabled(coll.kind, a)}
    if opts.algorithm != "auto":
        skip &= {TO_NCCL.get(opts.algorithm, opts.algorithm)}
    if skip:  # NCCL's tuner skips them for this op and datatype
        st = _without(st, coll.kind, frozenset(skip))
    if opts.algorithm != "auto":
        want = TO_NCCL.get(opts.algorithm)
        if want is None:
            return None  # an algorithm of phantora's own (hierarchical, direct): the ideal model
        st = _only(st, coll.kind, algo=want)
    if opts.protocol != "auto":
        st = _only(st, coll.kind, proto=opts.protocol)
    last = least_preferred(coll.dtype, coll.size, st.nccl_version)  # fp8 rings over many ranks: any other first
    choice = select(coll.kind, p, _without(st, coll.kind, last), coll.nbytes, pipe) if last else None
    choice = choice or select(coll.kind, p, st, coll.nbytes, pipe)
    if choice is not None and register_mode(st) == 1:
        choice = _registered(coll, p, st, choice)
    if choice is None:
        forced = dict(st.raw)
        what = ", ".join(f"{k}={v}" for k, v in forced.items() if k in ("NCCL_ALGO", "NCCL_PROTO"))
        asked = f"algorithm={opts.algorithm}, protocol={opts.protocol}"
        names = "/".join(T.NCCL_ALGO_NAMES[a] for a in sorted(skip))
        op = f"; NCCL runs no {names} for {coll.redop} on {coll.dtype}" if skip else ""
        by = next((k for k in ("NCCL_ALGO", "NCCL_PROTO") if k in forced), "algorithm")  # (what forced it)
        raise InputError(
            f"no NCCL algorithm/protocol available for {coll.kind} on {p.nnodes} node(s) x {p.ppn} GPU(s) "
            f"({what or asked}{op}); NCCL fails here too",
            field=by,
        )
    choice = _with_transports(choice, p, coll.kind)
    return dataclasses.replace(choice, works=calls) if calls > 1 else choice


def _p2p_plans(coll: Collective, on: Platform, st: NcclSettings, got: Choice) -> list[int]:
    """The calls each plan of `coll`'s group of `group_calls` equal p2p calls holds (NCCL 2.22+'s plan budget,
    p2p_plans.py; 2.19 - 2.21's work FIFO, fifo_budget.py) on communicator `on`; [] for one call or one plan."""
    if coll.group_calls < 2 or on.nranks < 2:
        return []
    per_peer = coll.nbytes if coll.kind == "send_recv" else coll.nbytes // on.nranks
    layout = transfer_layout(on, st, per_peer > 0)
    nodes = tuple(i // max(1, on.ppn) for i in range(on.nranks))
    shape = (coll.kind, nodes, coll.group_calls, max(1, got.channels), layout.channels(per_peer))
    peers = (layout.total, layout.most)
    if st.nccl_version < p2p_plans.PLANS_FROM:
        cut = fifo_budget.nccl_tests_p2p_plans(*shape, *peers)
        return cut if len(cut) > 1 else []
    release = running_release(st)
    rules = p2p_plans.batch_rules(release, st.p2p_epoch)
    return p2p_plans.calls_per_plan(*shape, *peers, rules, release, st.p2p_sched_group)


def call_sizes(coll: Collective) -> tuple[int, ...]:
    """The bytes of each call of `coll`'s NCCL group (`group_sizes`, or `group_calls` calls of nbytes); () alone."""
    if coll.group_sizes:
        return coll.group_sizes
    return (coll.nbytes,) * coll.group_calls if coll.group_calls > 1 else ()


def _group_pipe_ops(coll: Collective, sizes: tuple[int, ...], p: Platform, st: NcclSettings) -> int:
    """numPipeOps of the calls of `sizes` bytes, one aggregate of a group of only them, or of the group of
    `coll.plan_sizes` where NCCL keeps its aggregates apart (coll_group.py). Before 2.22 the group is one launch
    while it fits NCCL's work FIFO budget (fifo_budget.py; from 2.22 `group_plans` cuts it into NCCL's plans)."""
    group = coll.plan_sizes or sizes
    channels = comm_channels(p, ring_graph(p), st)
    if st.nccl_version < coll_group.SORTED_FROM:
        # the calls of `sizes` are one kernel; where the plan holds other aggregates, none of theirs is counted as
        # fusing with another (each element a work: the most works the group can take)
        kernels = [0] * len(group) if not coll.plan_sizes else list(range(len(group)))
        cut = fifo_budget.coll_group_plans(st.nccl_version, group, kernels, p.nranks, channels)
        if len(cut) > 1:
            raise InputError(
                f"{len(group)} collectives in one NCCL group: NCCL {st.nccl_version[0]}.{st.nccl_version[1]} cuts "
                f"them into {len(cut)} plans past its work FIFO budget ({fifo_budget.BUDGET} works a plan, "
                f"{cut[0]} calls in the first); several plans are not modelled before 2.22",
                field="-m" if coll.group_calls > 1 else "group_sizes",
            )
    return coll_group.pipe_ops(st.nccl_version, sizes, len(group), p.nranks, channels, sum(group))


def runs_as_one(coll: Collective, topo: Topology, opts: AlgoOptions) -> bool:
    """Whether NCCL runs `coll`'s `group_calls` equal calls of one group as one launch on their total: the symmetric
    kernels from 2.28 (symmetric_sched.cc), its legacy kernels for every other collective, one aggregate on one
    plan (enqueue.cc, coll_group.py), and all-to-all's and send/recv's operations to each peer one after another in
    one plan (p2p_calls.py); else (the ideal model) they run one by one. Raises where the group is not modelled."""
    if coll.group_calls < 2:
        return False
    if opts.model != "nccl" or coll.size < 2:
        return False
    if (opts.algorithm, opts.protocol) == ("auto", "auto"):
        st = settings(opts)
        p = platform_of(topo, coll.ranks, st)
        if ce_choice(coll, p, st) is not None:
            raise InputError("copy-engine collectives in a group of several calls are not modelled", field="-m")
        if _sym_op(coll) and sym_choice(coll, p, st) is not None:
            return True
    if coll.kind in ("all_to_all", "send_recv"):  # one plan: each peer's calls in turn (p2p_calls.py)
        return opts.algorithm in ("auto", "direct")
    return coll.kind in coll_group.KINDS


def _sym_op(coll: Collective) -> bool:
    """NCCL has a symmetric kernel for `coll`'s reduction: an all-gather, or a sum (ncclSymkImplemented, 2.27 -
    2.30: ncclDevSum, or 2.30's ncclDevSumPostDiv, which is avg on integers only; avg on floats is a PreMulSum).
    Any other reduction runs NCCL's legacy algorithms on the symmetric buffers."""
    return coll.kind not in ("all_reduce", "reduce_scatter") or coll.redop == "sum"


def _registered(coll: Collective, p: Platform, st: NcclSettings, choice: Choice) -> Choice:
    """`choice` on buffers registered with ncclCommRegister (-R 1): NCCL_CTA_POLICY EFFICIENCY's NVLS for a
    one-host all-gather or reduce-scatter when its registered CTAs are no more than the choice's, and NVLS /
    NVLS-Tree on their registered CTAs (register.py); the bandwidth stays NCCL's ("to saturate bandwidth")."""
    if efficiency_nvls(coll.kind, p, st) and choice.algorithm != "nvls":
        if registered_nvls_ctas(coll.kind, p, st) <= choice.channels:
            only = _only(_only(st, coll.kind, algo="nvls"), coll.kind, proto="Simple")
            choice = select(coll.kind, p, only, coll.nbytes) or choice
    if choice.algorithm not in ("nvls", "nvls_tree"):
        return choice
    return registered_nvls(choice, coll.kind, p, st, coll.nbytes)


def _p2p_registered(choice: Choice, p: Platform, comm: Platform, st: NcclSettings) -> Choice:
    """A send/recv or all-to-all `choice` (on `p`, its ranks; `comm`, the communicator it runs on) recorded as
    zero-copy where NCCL registers its buffers (-R 1; inside a node over P2P, across nodes without PXN:
    register.p2p_zero_copy). Its rating and flows stay the same."""
    p2p = "P2P" in dict(choice.transport) if choice.transport else not (p.intra == "nvlink" and p2p_off(st))
    if p2p_zero_copy(comm, st, choice.protocol, p.nnodes == 1, p2p):
        return dataclasses.replace(choice, registered=True)
    return choice


def comm_platform(coll: Collective, topo: Topology, st: NcclSettings) -> Platform:
    """The platform of the communicator a grouped send/recv runs on (`Collective.comm`): worked out once for its
    launch's pairs when it has one (`Collective.launch`)."""
    return shared(coll.launch, topo, ("platform", coll.comm, st), lambda: platform_of(topo, coll.comm, st))


def comm_hosts(topo: Topology, comm: tuple[int, ...], st: NcclSettings) -> tuple[int, ...]:
    """Each rank of `comm`'s NCCL node, numbered by `host_blocks` in the communicator's order: the nodes NCCL's p2p
    round schedule walks (init.cc, v2.19.4-1 .. v2.30.7-1: `comm->nNodes` and `rankToNode` count a node per ring's
    first rank, not per hostHash, so a host whose GPU pairs run NET, P2P off across its sockets, is one node a
    socket: `nccl_view`, net_split.py)."""
    view = nccl_view(topo, comm, st)
    hosts = [0] * len(comm)
    for h, block in enumerate(host_blocks(view, [view.node_of_rank(r) for r in comm])):
        for pos in block:
            hosts[pos] = h
    return tuple(hosts)


def _grouped(coll: Collective, topo: Topology, comm: Platform, st: NcclSettings, protocol: str) -> Choice:
    """A grouped send/recv on an NVLink host or across nodes, rated in its NCCL group (`Collective.in_flight`):
    nccl/p2p_group.py. The group is rated once for each start its pairs have (`p2p_group.rate_group` keyed by the
    group's pairs as positions in the communicator, with their starts after that start and their bytes). A pair
    with several operations (`LaunchGroup.later`) runs them in turn, each rated in its pass's group (in_turn.py)."""
    own = (coll.ranks[0], coll.ranks[1])
    pos = own if coll.comm == tuple(range(len(coll.comm))) else (coll.comm.index(own[0]), coll.comm.index(own[1]))
    from phantora.collectives.nccl.p2p_group import rated_choice

    def rate(k: int, g: LaunchGroup, t: int, nbytes: int) -> Choice:
        return rated_choice(_pass_rating(coll, topo, comm, st, protocol, g, t), pos, nbytes)

    return in_turn(coll, rate, _pair_plans(coll, topo, comm, st, protocol))


def _pair_plans(
    coll: Collective, topo: Topology, comm: Platform | None, st: NcclSettings, protocol: str
) -> tuple[int, ...]:
    """The NCCL plan of each operation of `coll`'s pair in its live group (`_live_plans`); () without a
    communicator."""
    if comm is None:
        return ()
    own = (coll.ranks[0], coll.ranks[1])
    pos = own if coll.comm == tuple(range(len(coll.comm))) else (coll.comm.index(own[0]), coll.comm.index(own[1]))
    return _live_plans(coll, topo, comm, st, protocol).get(pos, ())


def _live_plans(
    coll: Collective, topo: Topology, comm: Platform, st: NcclSettings, protocol: str
) -> dict[tuple[int, int], tuple[int, ...]]:
    """The NCCL plan of each operation of each pair (positions in the communicator) of `coll`'s live group, each rank
    cutting its own operations by NCCL 2.22+'s budget, the next plan from round 0 or the cut round as its release
    does (p2p_plans.pair_plans); {} before 2.22 or where no pair has more than one operation (made once for the
    launch's pairs)."""
    g = coll.in_flight
    if g is None or not g.later or st.nccl_version < p2p_plans.PLANS_FROM:
        return {}

    def make() -> dict[tuple[int, int], tuple[int, ...]]:
        from phantora.collectives.nccl.p2p_group import plan_parts  # numpy: kept off the netsim CLI's start-up

        at = {r: i for i, r in enumerate(coll.comm)}
        hosts = comm_hosts(topo, coll.comm, st)
        pairs = {(a, b): (at[a], at[b]) for a, b in g.pairs}
        ops = {pairs[p]: g.ops(p) for p in g.pairs}
        parts = [
            plan_parts(comm, st, hosts, {p: o[k][1] for p, o in ops.items() if len(o) > k}, protocol)
            for k in range(max(len(o) for o in ops.values()))
        ]
        chans = {p: tuple(parts[k][p].channels for k in range(len(o))) for p, o in ops.items()}
        most = transfer_layout(comm, st).most
        release = running_release(st)
        rules = p2p_plans.batch_rules(release, st.p2p_epoch)
        return p2p_plans.pair_plans(hosts, chans, most, p2p_plans.resumes(release), rules, release, st.p2p_sched_group)

    return shared(coll.launch, topo, ("live plans", coll.comm, st, protocol), make)


def _pass_rating(
    coll: Collective, topo: Topology, comm: Platform, st: NcclSettings, protocol: str, g: LaunchGroup, t: int
) -> Any:
    """`g`'s rating (a pass of `coll`'s launch group) from start `t`: made once for the launch's pairs."""

    def rating() -> Any:
        from phantora.collectives.nccl.p2p_group import rate_group  # numpy: kept off the netsim CLI's start-up

        at = {r: i for i, r in enumerate(coll.comm)}
        pairs = g.pairs
        if coll.comm != tuple(range(len(coll.comm))):  # ranks to positions in the communicator
            pairs = tuple((at[a], at[b]) for a, b in pairs)
        hosts = comm_hosts(topo, coll.comm, st)
        return rate_group(
            comm,
            st,
            hosts,
            dict(zip(pairs, zip([s - t for s in g.starts], g.sizes, strict=True), strict=True)),
            protocol,
        )

    key = ("rating", coll.comm, st, t, protocol) if g is coll.launch else ("rating", coll.comm, st, t, protocol, g)
    return shared(coll.launch, topo, key, rating)


def _node_shm(
    coll: Collective, topo: Topology, p: Platform, comm: Platform | None, st: NcclSettings
) -> dict[tuple[int, int], float] | None:
    """The pairs' rates over the hosts' PCIe and CPU links (positions in `coll.ranks`) of a p2p call on NCCL nodes
    of NVLink hosts with P2P off (`node_p2p.py`: SHM pairs inside a node, NET pairs' x16 legs between nodes): an
    all-to-all's pairs, or a grouped send/recv's own pair with its group's pairs in flight (their starts and bytes
    as `pci_p2p.group_ends` schedules them); None elsewhere."""
    if coll.kind == "all_to_all" and p.node_bw and p.nnodes > 1:
        n = len(coll.ranks)
        nodes = [topo.node_of_rank(r) for r in coll.ranks]
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
        return node_pair_rates(topo, nodes, pairs, st, gpu_name(topo), p.gpu_intra_bw) or None
    if coll.kind != "send_recv" or comm is None or not comm.node_bw:
        return None
    at = {r: i for i, r in enumerate(coll.comm)}
    own = (at[coll.ranks[0]], at[coll.ranks[1]])
    group = list(_inflight(coll)) or [own]
    nodes = [topo.node_of_rank(r) for r in coll.comm]
    gpu = gpu_name(topo)
    rates = node_pair_rates(topo, nodes, group, st, gpu, comm.gpu_intra_bw)
    if own not in rates:
        return None
    at_of = _inflight_at(coll)
    if any(p in rates for p in at_of):  # the group's SHM pairs start apart or move other bytes
        starts = {p: float(at_of.get(p, (0, coll.nbytes))[0]) for p in rates}
        sizes = {p: float(at_of.get(p, (0, coll.nbytes))[1]) for p in rates}
        starts[own], sizes[own] = 0.0, float(coll.nbytes)
        end = group_ends(lambda run: node_pair_rates(topo, nodes, run, st, gpu, comm.gpu_intra_bw), starts, sizes)
        if end[own] > 0:
            return {(0, 1): coll.nbytes / end[own]}
    return {(0, 1): rates[own]}


def _inflight(coll: Collective) -> tuple[tuple[int, int], ...]:
    """A grouped send/recv's transfers in flight (`Collective.inflight`) as positions in its communicator, its own
    first; () when its group is not known."""
    inflight, _ = coll.relative()
    if not inflight:
        return ()
    at = {r: i for i, r in enumerate(coll.comm)}
    own = (coll.ranks[0], coll.ranks[1])
    return tuple((at[a], at[b]) for a, b in (own, *(q for q in inflight if q != own)))


def _inflight_at(coll: Collective) -> dict[tuple[int, int], tuple[int, int]]:
    """`Collective.inflight_at` as (start offset ns, bytes) by positions in the communicator."""
    at = {r: i for i, r in enumerate(coll.comm)}
    return {(at[a], at[b]): (dt, n) for a, b, dt, n in coll.relative()[1]}


def _with_comm_gpus(p: Platform, gpus: int) -> Platform:
    """`p` (a send/recv's two ranks) with its communicator's GPU count, which NCCL's AMD P2P rule reads."""
    assert p.pci is not None
    return dataclasses.replace(p, pci=dataclasses.replace(p.pci, comm_gpus=gpus))


def _with_transports(choice: Choice, p: Platform, kind: str) -> Choice:
    """`choice` recording, on a described PCIe host, how many of its connections run P2P and SHM and their
    farthest path: the ring's hops (ring, tree), the (src, dst) of a send/recv, every pair of an all-to-all."""
    if p.pci is None or choice.algorithm not in ("ring", "tree", "p2p"):
        return choice
    pci = p.pci
    pairs = pci_paths.ring_hops(pci) if choice.algorithm != "p2p" else [(0, 1)]
    if kind == "all_to_all":
        pairs = pci_paths.all_pairs(pci)
    return dataclasses.replace(
        choice, transport=pci_paths.transports(pci, pairs), path=pci_paths.farthest_path(pci, pairs)
    )


def _net_transports(choice: Choice, coll: Collective, view: Topology, topo: Topology) -> Choice:
    """`choice` recording how many of its connections run NET (between NCCL nodes: `net_split.py`) and SHM
    (inside one): the ring's hops (ring, tree), the (src, dst) of a send/recv, every pair of an all-to-all."""
    nodes = [topo.node_of_rank(r) for r in coll.ranks]
    host = [view.nodes[n].host for n in nodes]
    n = len(nodes)
    if choice.algorithm in ("ring", "tree"):
        order = ring_order(host_blocks(view, nodes), 0)
        pairs = [(order[i], order[(i + 1) % n]) for i in range(n)]
    elif coll.kind == "all_to_all":
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    elif choice.algorithm == "p2p":
        pairs = [(0, 1)]
    else:
        return choice
    net = sum(host[a] != host[b] for a, b in pairs)
    counts = tuple((k, v) for k, v in (("NET", net), ("SHM", len(pairs) - net)) if v)
    return dataclasses.replace(choice, transport=counts, path="NET" if net else "SYS")


def check_transports(p: Platform, st: NcclSettings) -> None:
    """A clear error where NCCL_P2P_DISABLE / NCCL_P2P_LEVEL / NCCL_SHM_DISABLE ask for what is not modelled: P2P
    off on NVLink GPUs of a communicator spanning hosts without NICs (with NICs, net_split.py models it), or
    neither P2P nor SHM on a PCIe host."""
    if p.intra == "nvlink" and p.ppn > 1 and p2p_off(st):
        env = dict(st.raw)
        var = "NCCL_P2P_DISABLE" if env.get("NCCL_P2P_DISABLE", "").strip() == "1" else "NCCL_P2P_LEVEL"
        raise InputError(
            f"{var}={env.get(var, '').strip()} on NVLink GPUs of a communicator across hosts without NICs: not "
            "modelled (NCCL would join the hosts by NET, over RDMA NICs or its socket transport on the hosts' IP "
            "interfaces, and these GPUs have no network link in the topology)",
            field=var,
        )
    if p.pci is not None:
        pci_paths.ring_transports(p.pci)  # raises where a pair has neither P2P nor SHM


def nccl_chunk(coll: Collective, topo: Topology, opts: AlgoOptions, choice: Choice) -> int:
    """The payload bytes NCCL moves per step of this choice (the chunked granularity's chunk): a ring's Simple
    chunk is ALLREDUCE_CHUNKSTEPS steps of the buffer (2 MiB), LL's half a 64 KiB step, LL128's 15/16 of one;
    NVLS, NVLS-Tree, tree and PAT chunks as `calcCollChunking` sizes them; p2p the P2P chunk (each transfer's own
    step: `chunking.p2p_chunk_bytes`)."""
    st = settings(opts)
    p = platform_of(topo, coll.ranks, st)
    if choice.algorithm in ("sym", "ce"):
        return max(1, coll.nbytes)  # one flow a pair: the symmetric kernels' and copy engines' are not cut
    if choice.algorithm == "p2p":
        return comm_p2p_chunk(p, st)
    if choice.algorithm == "ring" and choice.protocol == "Simple" and coll.kind not in ("broadcast", "reduce"):
        return ring_simple_chunk(st, RING_CHUNK_STEPS)
    if choice.registered and choice.algorithm in ("nvls", "nvls_tree"):
        return registered_chunk(choice.algorithm, coll.kind, p, st, coll.nbytes, choice.channels)
    heads = nvls_heads(p) if choice.algorithm in ("nvls", "nvls_tree") else 1
    return chunk_bytes(choice.algorithm, choice.protocol, p, st, coll.nbytes, choice.channels * heads, coll.kind)


def _without(st: NcclSettings, kind: str, algos: frozenset[str]) -> NcclSettings:
    """`st` with `algos` disabled for one function: what NCCL's tuner skips for a call's op and datatype
    (redop.skipped), as it skips them in its cost table, whatever NCCL_ALGO enables."""
    table = {k: v for k, v in st.algos} if st.algos else {}
    table[kind] = table.get(kind, frozenset(T.ALGORITHMS)) - algos
    return dataclasses.replace(st, algos=tuple(sorted(table.items())))


def _only(st: NcclSettings, kind: str, algo: str | None = None, proto: str | None = None) -> NcclSettings:
    """`st` with one function restricted to one algorithm or protocol (what an explicit option means)."""
    if algo is not None:
        table = {k: v for k, v in st.algos} if st.algos else {}
        allowed = table.get(kind)
        table[kind] = frozenset({algo}) & allowed if allowed is not None else frozenset({algo})
        return dataclasses.replace(st, algos=tuple(sorted(table.items())))
    assert proto is not None
    table = {k: v for k, v in st.protos} if st.protos else {}
    allowed = table.get(kind)
    table[kind] = frozenset({proto}) & allowed if allowed is not None else frozenset({proto})
    return dataclasses.replace(st, protos=tuple(sorted(table.items())), protos_forced=True)


__all__ = [
    "Choice",
    "NcclSettings",
    "Platform",
    "choose",
    "runs_as_one",
    "nccl_chunk",
    "nccl_env",
    "platform_of",
    "settings",
    "summarize_choices",
]


def summarize_choices(
    records: list[dict[str, object]], env: tuple[tuple[str, str], ...] | None = None
) -> dict[str, object]:
    """results.json's `nccl`: how many collectives of each kind ran with each (algorithm, protocol; a symmetric
    kernel's name too, "sym/Simple/AllReduce_RSxLDMC_AGxSTMC"), from the
    trace's records (`cosim.json` `collectives[i].nccl`), and the NCCL_* variables honoured: the run's (`env`) and,
    if the program set its own before creating a process group, those (`program_env`, each set once, left out where
    they are `env`: a `--jobs` run's job whose own `env` table set them). A collective
    NCCL runs as a group of sends and receives (all-to-all, scatter, gather) has a record per pair (kind `send_recv`,
    named `all_to_all#1@0.1`): its pairs count under the collective's kind, not as sends and receives."""
    counts: dict[str, dict[str, int]] = {}
    program: list[dict[str, object]] = []
    base = dict(nccl_env() if env is None else env)
    for rec in records:
        own = rec.get("nccl_env")
        if isinstance(own, dict) and own != base and own not in program:
            program.append(own)
        choice = rec.get("nccl")
        if not isinstance(choice, dict):
            continue
        key = f"{choice['algorithm']}/{choice['protocol']}" + (f"/{choice['kernel']}" if choice.get("kernel") else "")
        per_kind = counts.setdefault(record_kind(str(rec.get("kind")), str(rec.get("name", ""))), {})
        per_kind[key] = per_kind.get(key, 0) + 1
    out: dict[str, object] = {"choices": counts, "env": base}
    if program:
        out["program_env"] = program
    return out
