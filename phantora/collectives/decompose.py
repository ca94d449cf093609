"""`decompose`: one collective call -> a DAG of point-to-point flows (pure: no clock, no I/O)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

from phantora.collectives.back_pressure import credit_latency
from phantora.collectives.channel_shares import channel_shares, plan_parts, ring_cut
from phantora.collectives.channel_turns import turn_delays
from phantora.collectives.dag import DagBuilder, FlowDag, MessageCounters, communicator_id
from phantora.collectives.dag import split as dag_split
from phantora.collectives.group_plans import OnePlanNotModelledError, Piece, chain_plans, group_plans
from phantora.collectives.hierarchical import hierarchical_all_reduce
from phantora.collectives.launch_group import shared
from phantora.collectives.layout import (
    fabric_switch,
    host_blocks,
    multi_host,
    rail_aligned,
    ring_order,
    rotate,
    tree_parents,
)
from phantora.collectives.nccl import (
    channel_split,
    coll_group,
    host_split,
    nvswitch_rings,
    part_loops,
    ring_nics,
    tree_chains,
    tree_channels,
)
from phantora.collectives.nccl import nvls_loops as nvls_loops_of
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import found_channels, found_speed, plan_channels
from phantora.collectives.nccl.chunking import chunk_bytes, p2p_chunk_bytes, step_bytes, tree_line_sweeps
from phantora.collectives.nccl.empty_kernel import empty_latency_us, launches_empty
from phantora.collectives.nccl.net_split import through_nics
from phantora.collectives.nccl.nvls_tree_loops import head_loops
from phantora.collectives.nccl.p2p import p2p_channels
from phantora.collectives.nccl.p2p_schedule import transfer_channel_ids
from phantora.collectives.nccl.part_loops import part_chunks
from phantora.collectives.nccl.platform import nccl_view, platform_of
from phantora.collectives.nccl.proxy import PROXY_STEP_US, RING_CHUNK_STEPS
from phantora.collectives.nccl.pxn import comm_relay, pxn_relay
from phantora.collectives.nccl.ring_round_up import DATA_WORD, LL128_GRAIN, run_threads
from phantora.collectives.nccl.ring_slices import slice_bytes
from phantora.collectives.nccl.shape import shape
from phantora.collectives.nccl.shared_steps import shared_depths
from phantora.collectives.nccl.tuning import Choice, running_release
from phantora.collectives.nvls import nvls_flows, nvls_loops, nvls_tree_flows
from phantora.collectives.options import resolve
from phantora.collectives.p2p import ChannelMap, ChunkOf, Depth, Relay, all_to_all, send_recv
from phantora.collectives.pat import pat_flows
from phantora.collectives.ring import ring_collective
from phantora.collectives.spec import DTYPE_BYTES, AlgoOptions, Collective
from phantora.collectives.sym import ce_flows, sym_flows
from phantora.collectives.sym_plans import sym_plans
from phantora.collectives.tree import tree_flows
from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.topology.model import Topology

BARRIER_SLICE_BYTES = 1  # a barrier is a tree all-reduce of one byte
# those whose flows `granularity=chunked` cuts into NCCL's steps (direct: NCCL's p2p, send/recv and all-to-all;
# p2p's and PAT's steps NCCL_STEPS in flight on a connection, `DagBuilder.add_chunks`).
CHUNKED_ALGORITHMS = ("ring", "tree", "chain", "nvls", "nvls_tree", "direct", "pat")


def decompose(
    coll: Collective,
    topo: Topology,
    opts: AlgoOptions = AlgoOptions(),  # noqa: B008 - frozen dataclass, safe as a default
    first_flow_id: int = 0,
    tag: str = "",
    sent: MessageCounters | None = None,
) -> FlowDag:
    """The flows of `coll` on `topo`, with ids from `first_flow_id` and tags prefixed by `tag/`.

    `opts` is resolved by `default_options` first (auto algorithm, channels=0). A group of one rank,
    or a collective of 0 bytes (other than barrier), needs no traffic: the DAG has no flows and every
    rank's `rank_last` list is empty, meaning the rank is done at the collective's start time. Under the
    NCCL model a call of 0 bytes NCCL launches (p2p always, a collective before 2.20: nccl/empty_kernel.py)
    is flows of 0 bytes whose delays are its kernel's time (`_empty_steps`, `_launch_only`).
    A barrier ignores `nbytes` and always runs as an all-reduce of one byte up and down one NCCL-like
    tree (a chain inside each host, a binary tree between hosts: what NCCL picks for a tiny
    all-reduce across hosts), so it costs twice the tree's height in sequential hops of latency,
    2(n-1) one-byte flows, and no bandwidth to speak of.
    `sent` carries the network connections' message counters from one call to the next (which queue pair a
    message takes under NCCL_IB_QPS_PER_CONNECTION); None starts them at 0 for this call alone.
    """
    if coll.mixed() and opts.model != "nccl":  # no NCCL plan: each (kind, reduction, root)'s calls alone, together
        return _bins_apart(coll, topo, opts, first_flow_id, tag, sent)
    sym_cut = sym_plans(coll, topo, opts) if coll.group_sizes or coll.group_calls > 1 else None
    if sym_cut is not None:  # symmetric calls NCCL 2.28 runs as several kernels, one after another
        return _kernels_dag(coll, sym_cut, topo, opts, first_flow_id, tag, sent)
    try:
        cut = group_plans(coll, topo, opts) if coll.group_sizes or coll.group_calls > 1 else None
    except (
        OnePlanNotModelledError
    ):  # symmetric kernels, copy engines or PAT among several kinds: not modelled as one plan
        return _bins_apart(coll, topo, opts, first_flow_id, tag, sent)
    if cut is not None:  # a group NCCL launches as several plans, one after another
        return _plans_dag(coll, cut, topo, first_flow_id, tag, sent)
    if coll.group_sizes and opts.model == "nccl":  # a group whose calls NCCL aggregates apart: each on its own
        several = group_aggregates(coll, topo, opts)
        if several is not None:
            return _aggregates_dag(several, topo, opts, first_flow_id, tag, sent)
    opts, choice = resolve(coll, topo, opts)
    base = topo
    if opts.model == "nccl":  # NCCL's nodes: a host's sockets apart where its GPU pairs run NET (net_split.py)
        topo = nccl_view(topo, coll.comm or coll.ranks, nccl_settings(opts))
    calls = 1  # p2p: the operations each transfer is, one after another on one call's channels (p2p_calls.py)
    if choice is not None and choice.works > 1 and coll.kind in P2P_KINDS:
        calls = choice.works
        coll = dataclasses.replace(coll, nbytes=coll.nbytes * calls, group_calls=1)
    elif choice is not None and choice.works > 1 and not coll.group_sizes:  # a group's calls: their bytes together
        sizes = (coll.nbytes,) * choice.works
        coll = dataclasses.replace(coll, nbytes=sum(sizes), group_calls=1, group_sizes=sizes)
    elif coll.group_calls > 1 and coll.kind != "barrier":  # no NCCL choice (model=ideal): all the calls' bytes
        coll = _calls_together(coll)
    nodes = [topo.node_of_rank(r) for r in coll.ranks]
    b = DagBuilder(nodes, coll.ranks, first_flow_id, f"{tag}/" if tag else "", comm=_communicator(coll, opts))
    if sent is not None:
        b.sent = sent
    if opts.model == "nccl":
        st = nccl_settings(opts)
        # a coarse flow stands for all the messages of its channel and hop, which NCCL posts to the QPs in turn:
        # over many messages that is an even split, so it is split as NCCL_IB_SPLIT_DATA_ON_QPS=1 splits one
        b.qps, b.split_qps = st.qps_per_conn, st.split_data_on_qps or opts.granularity == "coarse"
        b.host_of = {n: topo.nodes[n].host for n in nodes}
        b.credit_ns = credit_latency(topo, nodes)
        b.turn_ns = round(PROXY_STEP_US * 1000)  # a proxy's progress turn: its receives' posts, a relay's tail
    n = coll.size
    empty = n > 1 and coll.nbytes == 0 and choice is not None and _launches_empty(coll, opts)
    if empty and choice is not None and coll.kind not in P2P_KINDS:
        return _launch_only(b, n, choice)
    if not empty and (n == 1 or (coll.nbytes == 0 and coll.kind != "barrier")):
        return b.finish()
    _build(b, coll, topo, opts, nodes, choice.kernel if choice is not None else "", calls)
    dag = b.finish()
    if b.left_by:  # NCCL's ring leaves an NCCL node of SHM GPUs through its channel's NIC (nccl/ring_nics.py)
        dag.flows = [f.with_ends(b.left_by[f.id], f.dst) if f.id in b.left_by else f for f in dag.flows]
    if b.arrived_at:  # and arrives at the same NIC of the next node
        dag.flows = [f.with_ends(f.src, b.arrived_at[f.id]) if f.id in b.arrived_at else f for f in dag.flows]
    if topo is not base:
        dag.flows = through_nics(dag.flows, topo, base)
    if empty and choice is not None:
        return _empty_steps(dag, choice)
    if choice is not None:
        chunked = opts.granularity == "chunked" and opts.algorithm in CHUNKED_ALGORITHMS
        pipelined = opts.algorithm in ("tree", "chain", "nvls_tree")  # (NVLS-Tree's NVLS: each loop waits the tree)
        whole = None if b.split_qps else b.whole  # messages on the queue pairs in turn: one connection's rate
        kernels = chunked and opts.algorithm == "tree" and _tree_halves_share_the_channel(coll, topo, opts)
        dag.flows = shape(
            dag.flows,
            choice,
            coll.nbytes,
            topo,
            chunked=chunked,
            pipelined=pipelined,
            whole=whole,
            channel_queues=kernels,
            nic=(opts.nic_latency_ns, opts.nic_on_nvlink),
        )
        dag.choice = choice.to_dict()
    return dag


P2P_KINDS = ("all_to_all", "send_recv")


def _launches_empty(coll: Collective, opts: AlgoOptions) -> bool:
    """Whether NCCL launches `coll`, a call of 0 bytes (nccl/empty_kernel.py): a p2p transfer always, a collective
    before 2.20; NCCL discards the others before launching anything."""
    return launches_empty(coll.kind, nccl_settings(opts).nccl_version, coll.alltoall_api)


def _empty_steps(dag: FlowDag, choice: Choice) -> FlowDag:
    """A p2p call of 0 bytes NCCL launches (nccl/empty_kernel.py): its transfers' flows as the p2p path makes them
    (each pair's channel, relay and connection), each an empty step of 0 bytes. The engines end a flow of 0 bytes
    as it starts, so its delay is the kernel's whole time (`empty_latency_us`: nothing netted out for a propagation
    no engine charges it)."""
    delay = round(empty_latency_us(choice) * 1000)
    dag.flows = [dataclasses.replace(f, size=0, rate_bps=0, delay_ns=f.delay_ns + (0 if f.deps else delay))
                 for f in dag.flows]  # fmt: skip
    dag.choice = choice.to_dict()
    return dag


def _launch_only(b: DagBuilder, n: int, choice: Choice) -> FlowDag:
    """A collective of 0 bytes NCCL launches (before 2.20, nccl/empty_kernel.py): its kernel's loop runs no step, so
    each rank's kernel is its launch alone, a flow of 0 bytes from the rank to itself after `empty_latency_us`."""
    delay = round(empty_latency_us(choice) * 1000)
    for i in range(n):
        b.add(i, i, 0, "empty", 0, (), delay)
    dag = b.finish()
    dag.choice = choice.to_dict()
    return dag


def group_aggregates(coll: Collective, topo: Topology, opts: AlgoOptions) -> list[Collective] | None:
    """`coll`'s group of calls (`group_sizes`) as the aggregates NCCL makes of them (nccl/coll_group.py), each a
    collective of its calls, when there are several and NCCL runs its legacy kernels on them; else None (one
    aggregate: `decompose` runs it whole). Calls of mixed dtypes (`group_dtypes`) are aggregated per type, each
    aggregate a collective of its type; where one of them would run NCCL's symmetric kernels or copy engines (one
    kernel or plan per type, not modelled) the group is refused."""
    if coll.kind not in coll_group.KINDS or coll.size < 2 or len(coll.group_sizes) < 2:
        return None
    st = nccl_settings(opts)
    types = coll.group_dtypes or (coll.dtype,) * len(coll.group_sizes)
    calls = [(coll.kind, coll.redop, ty, s) for ty, s in zip(types, coll.group_sizes, strict=True)]
    aggs = coll_group.aggregates(st.nccl_version, calls)
    if len(aggs) < 2:
        return None
    if not coll.group_dtypes:
        whole = resolve(coll, topo, opts)[1]
        if whole is not None and whole.algorithm in ("sym", "ce"):
            return None
    out = []
    for members in aggs:
        sizes = tuple(coll.group_sizes[i] for i in members)
        part = dataclasses.replace(
            coll,
            nbytes=sum(sizes),
            dtype=types[members[0]],
            group_sizes=sizes if len(sizes) > 1 else (),
            group_dtypes=(),
            plan_sizes=coll.group_sizes,
        )
        out.append(part)
    if coll.group_dtypes:
        for part in out:
            got = resolve(part, topo, opts)[1]
            if got is not None and got.algorithm in ("sym", "ce"):
                raise InputError(
                    f"a group of {coll.kind}s of mixed dtypes ({', '.join(sorted(set(types)))}) whose {part.dtype} "
                    f"calls run NCCL's {'symmetric kernels' if got.algorithm == 'sym' else 'copy engines'}: not "
                    "modelled",
                    field="group_dtypes",
                )
    return out


def _plans_dag(
    coll: Collective,
    cut: list[list[Piece]],
    topo: Topology,
    first_flow_id: int,
    tag: str,
    sent: MessageCounters | None,
) -> FlowDag:
    """A group's plans (`group_plans.group_plans`), each decomposed as a group of its own calls on its aggregates'
    options, one after another (`group_plans.chain_plans`)."""
    dags: list[FlowDag] = []
    next_id = first_flow_id
    for k, pieces in enumerate(cut):
        sub = f"{tag}/plan{k}" if tag else f"plan{k}"
        if len(pieces) == 1:
            dag = decompose(pieces[0][0], topo, pieces[0][1], next_id, sub, sent)
        else:
            parts = [p for p, _, _ in pieces]
            dealt = [(p.dealt_from, p.dealt_parts) for p in parts]
            each = [o for _, o, _ in pieces]
            ids = [a for _, _, a in pieces]
            dag = _aggregates_dag(parts, topo, pieces[0][1], next_id, sub, sent, each, dealt, ids)
        dags.append(dag)
        next_id = dag.next_id
    calls = len(coll.group_sizes) or coll.group_calls
    return chain_plans(dags, coll.ranks, topo.node_of_rank, calls)


def _kernels_dag(
    coll: Collective,
    kernels: list[Collective],
    topo: Topology,
    opts: AlgoOptions,
    first_flow_id: int,
    tag: str,
    sent: MessageCounters | None,
) -> FlowDag:
    """A symmetric group's kernels (`sym_plans.sym_plans`), each decomposed as a group of its calls, one after
    another (`group_plans.chain_plans`)."""
    dags: list[FlowDag] = []
    next_id = first_flow_id
    for k, part in enumerate(kernels):
        dag = decompose(part, topo, opts, next_id, f"{tag}/plan{k}" if tag else f"plan{k}", sent)
        dags.append(dag)
        next_id = dag.next_id
    calls = len(coll.group_sizes) or coll.group_calls
    return chain_plans(dags, coll.ranks, topo.node_of_rank, calls)


def _aggregates_dag(
    parts: list[Collective],
    topo: Topology,
    opts: AlgoOptions,
    first_flow_id: int,
    tag: str,
    sent: MessageCounters | None,
    part_opts: list[AlgoOptions] | None = None,
    dealt_already: list[tuple[int, tuple[int, ...]]] | None = None,
    agg_ids: list[int] | None = None,
) -> FlowDag:
    """One group's aggregates in one launch: each decomposed with its own choice, all started together. NCCL deals
    their traffic over the plan's channels, so the group's bandwidth time is the sum of theirs (bytes / algbw each):
    each aggregate's flows are capped to spread its bytes over that sum, not over its own time. The choice recorded
    is the largest aggregate's, with the group's calls and every aggregate's pick. From 2.22 each aggregate's bytes
    are split over the channels as NCCL deals them, on from where the one before it stopped (`plan_parts`: its
    channel k runs NCCL channel `dealt_from` + k's ring or tree), and an aggregate after the first
    has its own connection ids (`_apart`): the packet engine runs one connection's messages in turn, which would
    put the capped aggregates one after another there and double their time against the flow engine's.
    `part_opts`: each part's own options (a plan's pieces, on their aggregates' choices; default `opts` for all);
    `dealt_already`: each part's (first channel, parts) as its plan dealt them (default: `plan_parts`).
    Aggregates that share a channel run their works there in turn (`channel_turns`): a later one's first flows wait
    for the earlier one's latency, then its own less the launch's base; `agg_ids`: each part's aggregate (a plan's
    pieces of one aggregate are not chained; default: each part its own)."""
    each = part_opts or [opts] * len(parts)
    dealt = dealt_already or plan_parts(
        parts, [resolve(part, topo, o)[0] for part, o in zip(parts, each, strict=True)], topo
    )
    if dealt is not None and dealt_already is None:  # NCCL deals the aggregates one after another over the channels
        parts = [
            dataclasses.replace(p, dealt_parts=d, dealt_from=lo) if d else p
            for p, (lo, d) in zip(parts, dealt, strict=True)
        ]
    dags: list[FlowDag] = []
    next_id = first_flow_id
    for i, (part, o) in enumerate(zip(parts, each, strict=True)):
        dag = decompose(part, topo, o, next_id, f"{tag}/agg{i}" if tag else f"agg{i}", sent)
        dags.append(dag)
        next_id = dag.next_id
    extra = turn_delays([(part, dag) for part, dag in zip(parts, dags, strict=True)], agg_ids)
    times = [_bandwidth_ns(part, dag) for part, dag in zip(parts, dags, strict=True)]
    total = sum(times)
    flows: list[Flow] = []
    last: dict[int, list[int]] = {}
    for i, (dag, t) in enumerate(zip(dags, times, strict=True)):
        scale = t / total if total > 0 else 1.0
        for f in dag.flows:
            if f.rate_bps:
                f = dataclasses.replace(f, rate_bps=math.ceil(f.rate_bps * scale))
            if extra[i] and not f.deps:  # its turn on the channels it shares (channel_turns.py)
                f = f.with_deps((), f.delay_ns + extra[i])
            flows.append(dataclasses.replace(f, conn=_apart(f.conn, i)) if i and f.conn else f)
        for r, ids in dag.rank_last.items():
            last.setdefault(r, []).extend(ids)
    for r in parts[0].ranks:
        last.setdefault(r, [])
    biggest = max(range(len(parts)), key=lambda i: parts[i].nbytes)
    choice = dict(dags[biggest].choice or {})
    choice["group_calls"] = sum(max(1, len(p.group_sizes)) for p in parts)
    choice["aggregates"] = [
        {
            "algorithm": (d.choice or {}).get("algorithm"),
            "protocol": (d.choice or {}).get("protocol"),
            "calls": max(1, len(p.group_sizes)),
            "bytes": p.nbytes,
        }
        for p, d in zip(parts, dags, strict=True)
    ]
    return FlowDag(flows, last, next_id, choice)


def _bins_apart(
    coll: Collective, topo: Topology, opts: AlgoOptions, first_flow_id: int, tag: str, sent: MessageCounters | None
) -> FlowDag:
    """A group of several kinds, reductions or roots (`Collective.mixed`) outside NCCL's model (model=ideal) or whose
    one plan is not modelled (`OnePlanNotModelledError`): each (kind, reduction, root)'s calls as one collective of
    their own, all started together."""
    m = len(coll.group_sizes)
    kinds = coll.group_kinds or (coll.kind,) * m
    redops = coll.group_redops or (coll.redop,) * m
    roots = coll.group_roots or (coll.root,) * m
    types = coll.group_dtypes or (coll.dtype,) * m
    bins: dict[tuple[str, str, int | None], list[int]] = {}
    for i in range(m):
        bins.setdefault((kinds[i], redops[i], roots[i]), []).append(i)
    flows: list[Flow] = []
    last: dict[int, list[int]] = {r: [] for r in coll.ranks}
    next_id, choice = first_flow_id, None
    for k, ((kind, redop, root), members) in enumerate(bins.items()):
        sizes, ts = tuple(coll.group_sizes[i] for i in members), tuple(types[i] for i in members)
        part = dataclasses.replace(
            coll, kind=kind, redop=redop, root=root, nbytes=sum(sizes), dtype=ts[0],
            group_sizes=sizes if len(sizes) > 1 else (), group_dtypes=ts if len(sizes) > 1 and len(set(ts)) > 1 else (),
            group_kinds=(), group_redops=(), group_roots=(),
        )  # fmt: skip
        dag = decompose(part, topo, opts, next_id, f"{tag}/bin{k}" if tag else f"bin{k}", sent)
        next_id, choice = dag.next_id, choice or dag.choice
        flows.extend(dag.flows)
        for r, ids in dag.rank_last.items():
            last.setdefault(r, []).extend(ids)
    return FlowDag(flows, last, next_id, choice)


def _apart(conn: int, index: int) -> int:
    """Aggregate `index`'s own id for connection `conn` (stable across processes, never 0)."""
    text = f"{conn}:agg{index}"
    return (int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1) | 1


def _bandwidth_ns(part: Collective, dag: FlowDag) -> float:
    """An aggregate's bandwidth time under NCCL's model: its bytes over the choice's algorithm bandwidth."""
    algbw = float((dag.choice or {}).get("model_algbw_gbs", 0.0))
    return part.nbytes / algbw if algbw > 0 else 0.0


def _communicator(coll: Collective, opts: AlgoOptions) -> int:
    """The connection set a collective's flows use: NCCL's p2p connections for all-to-all and send/recv, else the
    chosen algorithm's (all-reduce, all-gather and reduce-scatter share the ring's), of this group (a grouped
    send/recv: of the communicator it runs on)."""
    family = "p2p" if coll.kind in P2P_KINDS else str(opts.algorithm)
    return communicator_id(family, coll.comm or coll.ranks)


def _p2p_channel_map(coll: Collective, topo: Topology, opts: AlgoOptions) -> ChannelMap | None:
    """NCCL's p2p channel ids for a transfer's parts, from its sender's round schedule on the communicator (the
    call's group, or a grouped send/recv's communicator) in the running NCCL's form; None outside the NCCL model
    (channels 0..n-1)."""
    if opts.model != "nccl":
        return None
    comm = coll.comm or coll.ranks
    st = nccl_settings(opts)

    def layout() -> tuple[tuple[str, ...], int]:  # the communicator's hosts and p2p channels
        hosts = tuple(_host_key(topo, topo.node_of_rank(r)) for r in comm)
        return hosts, p2p_channels(platform_of(topo, comm, st), st)

    hosts, total = shared(coll.launch, topo, ("p2p channels", comm, st), layout)  # once for a launch's pairs
    pos = [comm.index(r) for r in coll.ranks]
    release = running_release(st)

    def channels(src: int, dst: int, parts: int) -> list[int]:
        return transfer_channel_ids(hosts, pos[src], pos[dst], parts, total, release, st.p2p_sched_group)

    return channels


def _p2p_chunk(coll: Collective, topo: Topology, opts: AlgoOptions, calls: int = 1) -> ChunkOf | None:
    """NCCL's step of each p2p transfer (`chunking.p2p_chunk_bytes`: the communicator's p2p chunk, smaller for a
    small transfer to a peer on another host; a transfer of `calls` operations: one operation's); None outside the
    NCCL model (one flow a part)."""
    if opts.model != "nccl":
        return None
    comm = coll.comm or coll.ranks
    st = nccl_settings(opts)
    on = platform_of(topo, comm, st)
    hosts = [_host_key(topo, topo.node_of_rank(r)) for r in coll.ranks]

    def chunk(src: int, dst: int, nbytes: int) -> int:
        return p2p_chunk_bytes(opts.protocol, on, st, nbytes // calls, network=hosts[src] != hosts[dst])

    return chunk


def _net_p2p_depth(
    coll: Collective, topo: Topology, opts: AlgoOptions, parts: int, cmap: ChannelMap | None, relay: Relay | None
) -> Depth:
    """Steps in flight on each part of a direct all-to-all: NCCL_STEPS inside a host; across hosts the shared
    buffer's slots of the part's channel, split among the sending proxy's (the sender's, or its PXN relay's) and
    the receiver's transfers on it (`shared_steps`)."""
    window = _steps_in_flight(opts)
    if opts.model != "nccl":
        return lambda src, dst, channel: window
    hosts = [_host_key(topo, topo.node_of_rank(r)) for r in coll.ranks]
    n = len(hosts)
    ids = cmap or (lambda src, dst, k: list(range(k)))

    def proxy(src: int, dst: int) -> int:  # the GPU whose proxy sends src's transfer to dst
        via = relay(src, dst) if relay is not None else None
        return src if via is None else via

    remote = [(r, j, proxy(r, j), ids(r, j, parts)) for r in range(n) for j in range(n) if hosts[r] != hosts[j]]
    depths = shared_depths(remote)
    return lambda src, dst, channel: depths.get((src, dst, channel), window)


def _steps_in_flight(opts: AlgoOptions, chunk_steps: int = 1) -> int:
    """Messages a connection keeps in flight under NCCL's model: its buffer's NCCL_STEPS slots over the slots one
    message takes (`chunk_steps`; a sender's slice waits until the receiver has freed the slot NCCL_STEPS back:
    prims_simple.h `waitPeer`, NCCL v2.30.7-1); outside it, one at a time."""
    return max(1, T.NCCL_STEPS // chunk_steps) if opts.model == "nccl" else 1


def _ring_chunk_steps(opts: AlgoOptions) -> int:
    """Buffer slots one chunk of an all-reduce / all-gather / reduce-scatter ring takes: Simple's
    ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS (NCCL_STEPS / 2; its empty slices still advance the step,
    prims_simple.h), 1 for LL and LL128 (calcCollChunking's chunkSteps, enqueue.cc; collectives.h, v2.30.7-1)."""
    return RING_CHUNK_STEPS.get(opts.protocol, 1)


def _ring_slicer(coll: Collective, opts: AlgoOptions) -> Callable[[int], list[int]] | None:
    """A chunked Simple ring's chunk -> its slices' bytes (`nccl.ring_slices`: its elements and the Simple step);
    None under LL and LL128 (a chunk of one slot, one slice)."""
    if opts.protocol != "Simple":
        return None
    elem, step = DTYPE_BYTES[coll.dtype], step_bytes("Simple", nccl_settings(opts))
    return lambda chunk: slice_bytes(chunk, elem, step)


def _tree_sweeps(coll: Collective, topo: Topology, opts: AlgoOptions) -> tuple[int, int] | None:
    """A tree all-reduce over NVLink nodes under NCCL's LL or LL128: the bytes its reduce and broadcast halves
    forward per sweep of lines (`chunking.tree_line_sweeps`), the pieces each chunk crosses a hop in (a hop across
    hosts in the receiver's sweeps, as its lines land, each once the sender has the whole step: `tree_flows`); None
    elsewhere (Simple posts whole steps; PCIe nodes). The root receives, reduces and sends with all its threads,
    but each of its warps forwards its own lines as they land (no barrier between the sweeps of a call,
    prims_ll128.h `GenericOp`), so its sends are cut like the broadcast half's."""
    if opts.model != "nccl":
        return None
    p = platform_of(topo, coll.comm or coll.ranks, nccl_settings(opts))  # P2P off: NCCL's PCIe view
    return tree_line_sweeps(opts.protocol) if p.intra == "nvlink" else None


def _chain_sweep(coll: Collective, topo: Topology, opts: AlgoOptions) -> int | None:
    """A broadcast or reduce chain over NVLink nodes under NCCL's LL or LL128: the data bytes one sweep of its
    ring kernel's threads forwards (`run_threads` x 8 B a line under LL, 60 B a lane under LL128), the pieces each
    chunk crosses an NVLink hop in: broadcast.h / reduce.h `runRing` run prims_ll*.h `GenericOp`, whose warps send
    their lines on as they land, each line with its flag, as a tree's do (`_tree_sweeps`); a hop across hosts sends
    whole steps, which land in the receiver's sweeps (`tree_flows`). None elsewhere (Simple posts whole steps; PCIe
    nodes)."""
    if opts.model != "nccl" or opts.protocol not in ("LL", "LL128"):
        return None
    p = platform_of(topo, coll.comm or coll.ranks, nccl_settings(opts))  # P2P off: NCCL's PCIe view
    if p.intra != "nvlink":
        return None
    threads = run_threads(coll.kind, opts.protocol, p, coll.nbytes, opts.channels)
    return threads * (DATA_WORD if opts.protocol == "LL" else LL128_GRAIN)


def _tree_part_chunk(coll: Collective, topo: Topology, opts: AlgoOptions, part: int) -> int:
    """The chunk of a tree channel's `part` bytes: from NCCL 2.22 `calcCollChunking` sizes each part's chunk from
    the part alone (enqueue.cc `scheduleCollTasksToPlan`, v2.22.3-1 to v2.30.7-1); before it, the call's one chunk
    (`opts.chunk_bytes`, from all its bytes over all channels)."""
    st = nccl_settings(opts)
    if st.nccl_version < channel_split.SPLIT_FROM:
        return opts.chunk_bytes
    return chunk_bytes("tree", opts.protocol, platform_of(topo, coll.comm or coll.ranks, st), st, part, 1)


def _nvls_tree_loops(coll: Collective, topo: Topology, opts: AlgoOptions, heads: int) -> list[list[list[int]]]:
    """NVLS-Tree's tree chunks (`nccl.nvls_tree_loops`): per channel, per head GPU, the bytes of each loop, NCCL's
    by version under its model (`_nvls_loops`); outside it the bytes split evenly over the channels with the call's
    one chunk (`opts.chunk_bytes`)."""
    got = _nvls_loops(coll, topo, opts, heads, "nvls_tree")
    if got is not None:
        return got
    channels = max(1, opts.channels)
    return [head_loops(part, max(1, opts.chunk_bytes), heads) for part in dag_split(coll.nbytes, channels)]


def _nvls_loops(
    coll: Collective, topo: Topology, opts: AlgoOptions, heads: int, algo: str = "nvls"
) -> list[list[list[int]]] | None:
    """An NVLS (one node) or NVLS-Tree all-reduce's loops under NCCL's model (`nccl.nvls_loops`): per channel, per
    head GPU, the bytes of each loop; a one-node NVLS all-gather's or reduce-scatter's per channel, as one head, the
    bytes of a rank's block each loop moves (its kernel walks a channel's part in whole chunks, the last what is
    left: all_gather.h / reduce_scatter.h oneNode, v2.20.3-1 to v2.30.7-1). From 2.22 NCCL's parts (`channel_split`,
    over the communicator's NVLS channels), each with its own chunk; 2.20-2.21 the host's parts (`host_split`,
    Simple's alignment) with the call's chunk; before, the buffer strided by all channels in the call's chunk. None
    outside the model."""
    if opts.model != "nccl":
        return None
    st = nccl_settings(opts)
    channels, version, kind, n = max(1, opts.channels), st.nccl_version, coll.kind, coll.size
    count = channel_split.count_bytes(kind, n, coll.nbytes)  # all-gather / reduce-scatter: a rank's block
    ops = heads  # calcCollChunking's concurrent operations of a part: its heads
    if kind != "all_reduce":  # one-node all-gather / reduce-scatter: a loop a chunk, no heads (`nvls_loops`)
        heads = 1
    if version < host_split.HOST_SPLIT_FROM:
        return nvls_loops_of.grid_loops(count, channels, heads, max(1, opts.chunk_bytes))
    p = platform_of(topo, coll.comm or coll.ranks, st)
    comm = plan_channels(algo, p, st)
    parts = channel_split.split(version, kind, "Simple", n, count, channels, comm)
    if parts is None:
        host = list(host_split.split(count, channels, host_split.SIMPLE_ALIGN))
        chunks = [max(1, opts.chunk_bytes)] * len(host)
    else:
        host = list(parts)
        per = channel_split.global_per_count_byte(kind, n)
        chunks = [chunk_bytes(algo, "Simple", p, st, part * per, ops, kind) for part in host]
    if kind != "all_reduce":
        return [[part_chunks(part, chunk)] for part, chunk in zip(host, chunks, strict=True)]
    return nvls_loops_of.part_loops(version, host, chunks, heads, algo)


def _nccl_part_loops(opts: AlgoOptions) -> bool:
    """Whether a chunked tree's or chain's channel parts go in NCCL's own chunks (`nccl.part_loops`: whole chunks,
    the last what is left; the NCCL model from 2.20), not near-equal ones."""
    return opts.model == "nccl" and part_loops.applies(nccl_settings(opts).nccl_version)


def _tree_halves_share_the_channel(coll: Collective, topo: Topology, opts: AlgoOptions) -> bool:
    """A tree all-reduce inside one NVLink node under NCCL's Simple: `runTreeSplit` (all_reduce.h, v2.30.7-1) runs
    a channel's reduce half and broadcast half side by side in the channel's one thread block, so they share its
    rate (NCCL's per-channel bandwidth): a half sending alone, as in the pipeline's fill, has all of it."""
    if opts.model != "nccl" or opts.protocol != "Simple":
        return False
    p = platform_of(topo, coll.comm or coll.ranks, nccl_settings(opts))  # P2P off: NCCL's PCIe view
    return p.nnodes == 1 and p.intra == "nvlink"


def channel_chain(coll: Collective, topo: Topology, opts: AlgoOptions) -> Callable[[int], int]:
    """Channel -> the rotation of each host's chain its ring runs (`layout.ring_order`). NCCL model: the found
    search channel it is a copy of (`nccl/tree_channels.chain_of`); phantora's own: the channel itself."""
    if opts.model != "nccl":
        return lambda c: c
    st = nccl_settings(opts)
    p = platform_of(topo, coll.ranks, st)
    return lambda c: tree_channels.chain_of(p, st, c + coll.dealt_from)


def _tree_of_channel(coll: Collective, topo: Topology, opts: AlgoOptions) -> Callable[[int], tuple[int, int]]:
    """Channel -> (tree of the double binary tree, the rotation of each host's chain). NCCL model: NCCL's mapping,
    tree 1 on the upper half of the search's duplicated channels and a channel's copy on its chain
    (`nccl/tree_channels.py`); phantora's own: tree c mod 2, the chain rotated by c // 2."""
    if opts.model != "nccl":
        return lambda c: (c % 2, c // 2)
    st = nccl_settings(opts)
    p = platform_of(topo, coll.ranks, st)
    return lambda c: tree_channels.tree_of(p, st, c + coll.dealt_from)


def _shm_nodes(coll: Collective, topo: Topology, opts: AlgoOptions) -> bool:
    """Whether NCCL's nodes of `coll` are NVLink hosts, or their sockets, on SHM with NICs between them (P2P off:
    nccl/net_split.py), whose rings neither alternate nor leave by the sender's own NIC (nccl/ring_nics.py)."""
    return opts.model == "nccl" and ring_nics.shm_nodes(platform_of(topo, coll.ranks, nccl_settings(opts)))


def _calls_together(coll: Collective) -> Collective:
    """A group of `group_calls` equal calls without NCCL's choice (model=ideal) as one collective of all their bytes
    (before 2026-12-03 it moved one call's): a collective's calls as its `group_sizes`, a send/recv's or
    all-to-all's as one transfer of their sum."""
    total = coll.nbytes * coll.group_calls
    if coll.kind in P2P_KINDS:
        return dataclasses.replace(coll, nbytes=total, group_calls=1)
    return dataclasses.replace(coll, nbytes=total, group_calls=1, group_sizes=(coll.nbytes,) * coll.group_calls)


def channel_rings(
    coll: Collective, topo: Topology, opts: AlgoOptions, nodes: list[int], blocks: list[list[int]], count: int
) -> list[list[int]]:
    """The ring of each of `count` channels. NCCL nodes of SHM GPUs (P2P off: nccl/ring_nics.py): NCCL's ring
    through each node, 0, n-1, ..., 1 by GPU index, on every channel. NVSwitch hosts with P2P on and a NIC per GPU
    (nccl/nvswitch_rings.py): found channel g runs NCCL's order through each host from NIC g mod m, the same on
    every host. Else `layout.ring_order` on the channel's chain, alternating on rail-aligned fabrics."""
    if _shm_nodes(coll, topo, opts):
        order = ring_nics.ring(ring_nics.by_index(blocks, nodes))
        return [list(order) for _ in range(count)]
    chain = channel_chain(coll, topo, opts)
    hosts = _nvswitch_hosts(coll, topo, opts, nodes, blocks)
    if hosts is not None:
        ordered, rings = hosts
        return [ring_nics.ring(ordered, _order(rings[chain(c) % len(rings)])) for c in range(count)]
    alternate = rail_aligned(topo, nodes, blocks)
    return [ring_order(blocks, chain(c), alternate) for c in range(count)]


def _nvswitch_layout(
    coll: Collective, topo: Topology, opts: AlgoOptions, nodes: list[int], blocks: list[list[int]]
) -> tuple[list[list[int]], list[int]] | None:
    """NVSwitch hosts with P2P on and one NIC per GPU, the same GPU count on each (nccl/nvswitch_rings.py): each
    host's positions by GPU index and the PCIe switch of each (the first host's layout); else None."""
    if opts.model != "nccl" or not multi_host(blocks) or any(fabric_switch(topo, v) is None for v in nodes):
        return None
    if not nvswitch_rings.applies(platform_of(topo, coll.ranks, nccl_settings(opts))):
        return None
    ordered = ring_nics.by_index(blocks, nodes)
    host = topo.nodes[nodes[ordered[0][0]]].host
    gpus = sorted(v.id for v in topo.nodes if v.kind == "gpu" and v.host == host)
    return ordered, nvswitch_rings.switch_of([gpus.index(nodes[pos]) for pos in ordered[0]])


def _nvswitch_hosts(
    coll: Collective, topo: Topology, opts: AlgoOptions, nodes: list[int], blocks: list[list[int]]
) -> tuple[list[list[int]], list[nvswitch_rings.HostRing]] | None:
    """`_nvswitch_layout`'s hosts by GPU index and each found channel's ring through a host; else None."""
    layout = _nvswitch_layout(coll, topo, opts, nodes, blocks)
    if layout is None:
        return None
    st = nccl_settings(opts)
    ordered, switch = layout
    return ordered, nvswitch_rings.found_rings(
        switch, found_channels(platform_of(topo, coll.ranks, st)), st.nccl_version
    )


def _channel_trees(
    b: DagBuilder, coll: Collective, topo: Topology, opts: AlgoOptions, nodes: list[int], blocks: list[list[int]]
) -> Callable[[int], tuple[int, list[int | None]]]:
    """Channel -> (its tree of the double binary tree, the parent of every position). On `_nvswitch_layout`'s hosts
    NCCL's BALANCED_TREE (nccl/tree_chains.py): found channel g's chain through each host from NIC g mod m's search,
    its child nodes of child type 0 on the chain's second GPU, and every hop between hosts by the channel's NIC
    (`b.exits`, `b.arrivals`). Else each host's chain rotated to its head (`layout.tree_parents`), every hop between
    hosts at the head."""
    trees = _tree_of_channel(coll, topo, opts)
    layout = _nvswitch_layout(coll, topo, opts, nodes, blocks)
    if layout is None or not tree_chains.applies(layout[1]):

        def rotated(c: int) -> tuple[int, list[int | None]]:
            which, head = trees(c)
            return which, tree_parents(blocks, which, head)

        return rotated
    ordered, switch = layout
    version = nccl_settings(opts).nccl_version
    host = {pos: k for k, h in enumerate(ordered) for pos in h}

    def channel(c: int) -> tuple[int, list[int | None]]:
        which, found = trees(c)
        order, nic = tree_chains.host_chain(switch, found, version)
        parent = tree_chains.chained_tree([[h[k] for k in order] for h in ordered], which, tree_chains.BALANCED_TREE)
        for v, up in enumerate(parent):
            if up is not None and host[v] != host[up]:
                here, there = ordered[host[v]][nic], ordered[host[up]][nic]
                _mark_hops(b, c, {(v, up): (here, there), (up, v): (there, here)})
        return which, parent

    return channel


def _order(ring: nvswitch_rings.HostRing) -> ring_nics.Order:
    """A found channel's ring through a host as `ring_nics.ring` takes it."""
    return lambda size: ring.order


def _leave_by_entry_nics(
    b: DagBuilder, coll: Collective, topo: Topology, opts: AlgoOptions, nodes: list[int], blocks: list[list[int]],
    count: int,
) -> None:  # fmt: skip
    """On NCCL nodes of SHM GPUs (nccl/ring_nics.py), and on NVSwitch hosts with P2P on and a NIC per GPU
    (nccl/nvswitch_rings.py), each of `count` channels' ring hops between nodes leaves by its channel's NIC and
    arrives at the same NIC of the next node (`b.exits`, `b.arrivals`)."""
    chain = channel_chain(coll, topo, opts)
    hosts = _nvswitch_hosts(coll, topo, opts, nodes, blocks)
    if hosts is not None:  # P2P on: found channel g's NIC is GPU g mod m's (nccl/nvswitch_rings.py)
        ordered, rings = hosts
        for c in range(count):
            ring = rings[chain(c) % len(rings)]
            _mark_hops(b, c, ring_nics.hops(ordered, ring.nic, _order(ring)))
        return
    if not _shm_nodes(coll, topo, opts):
        return
    p = platform_of(topo, coll.ranks, nccl_settings(opts))
    speed = found_speed(p)
    per_nic = int(p.nic_bw // speed) if speed > 0 else 1
    nics = ring_nics.entry_nics(found_channels(p), max(1, p.nics_per_node), max(1, per_nic))
    ordered = ring_nics.by_index(blocks, nodes)
    for c in range(count):
        _mark_hops(b, c, ring_nics.hops(ordered, nics[chain(c) % len(nics)]))


def _mark_hops(b: DagBuilder, channel: int, hops: dict[tuple[int, int], tuple[int, int]]) -> None:
    """Record where each of a channel's hops between nodes leaves and arrives, where not at its ends' own NICs."""
    for (src, dst), (out, into) in hops.items():
        if out != src:
            b.exits[channel, src, dst] = out
        if into != dst:
            b.arrivals[channel, src, dst] = into


def _chain_links(order: list[int], up: bool) -> list[int | None]:
    """Each position's peer in a ring chain opened at its root (`order[0]`): a broadcast's parent is its ring
    predecessor (broadcast.h: the root sends to its next, each rank forwards to its next); a reduce's is its ring
    successor, the root's successor sending first and the root receiving last (reduce.h, v2.26.2-1 to v2.30.7-1:
    `prevRank == root` only sends, every rank receives from ring->prev and sends to ring->next)."""
    links: list[int | None] = [None] * len(order)
    if up:
        tail = order[1:] + order[:1]  # the root's successor first, the root last
        for a, v in zip(tail, tail[1:], strict=False):
            links[a] = v
    else:
        for a, v in zip(order, order[1:], strict=False):
            links[v] = a
    return links


def _host_key(topo: Topology, node: int) -> str:
    """The host an endpoint node is on (an endpoint without a host is a host of its own)."""
    host = topo.nodes[node].host
    return f"host:{host}" if host is not None else f"node:{node}"


def _build(
    b: DagBuilder,
    coll: Collective,
    topo: Topology,
    opts: AlgoOptions,
    nodes: list[int],
    kernel: str = "",
    calls: int = 1,
) -> None:
    """Add the flows of `coll` with resolved options `opts` to `b` (`kernel`: NCCL's symmetric kernel, algorithm
    "sym")."""
    n = coll.size
    blocks = host_blocks(topo, nodes)
    chunked = opts.granularity == "chunked"
    common: dict[str, Any] = {
        "chunked": chunked,
        "chunk_bytes": opts.chunk_bytes,
        "step_delay_ns": opts.step_latency_ns,
    }
    ch = opts.channels
    kind, algo = coll.kind, opts.algorithm
    if kind == "barrier":
        common["chunked"] = True
        tree_flows(b, tree_parents(blocks, 0, 0), BARRIER_SLICE_BYTES, 0, up=True, down=True, name="tree", **common)
    elif algo in ("nvls", "nvls_tree"):
        heads = min(T.NVLS_MAX_ARITY, max(len(block) for block in blocks))  # channels.nvls_heads
        loops = nvls_loops(coll.nbytes, ch, heads, opts.chunk_bytes) if chunked else 1
        if algo == "nvls":
            per_head = _nvls_loops(coll, topo, opts, heads) if chunked else None
            nvls_flows(b, kind, blocks, coll.nbytes, loops=loops, head_loops=per_head)
        else:
            tree_heads = min(T.NVLS_MAX_ARITY, min(len(block) for block in blocks))  # a head on every host
            per = _nvls_tree_loops(coll, topo, opts, tree_heads) if chunked else None
            nvls_tree_flows(b, blocks, coll.nbytes, ch, loops, window=_steps_in_flight(opts), head_loops=per)
    elif algo == "sym":
        sym_flows(b, kind, kernel, n, coll.nbytes, blocks)
    elif algo == "ce":
        ce_flows(b, kind, n, coll.nbytes, blocks)
    elif algo == "pat":
        pat_flows(b, kind, n, coll.nbytes, chunk=opts.chunk_bytes if chunked else 0, window=_steps_in_flight(opts))
    elif kind in ("all_reduce", "all_gather", "reduce_scatter") and algo == "ring":
        shares = channel_shares(coll, topo, opts)
        orders = channel_rings(coll, topo, opts, nodes, blocks, len(shares))
        _leave_by_entry_nics(b, coll, topo, opts, nodes, blocks, len(shares))
        in_turn = opts.model == "nccl"
        window = _steps_in_flight(opts, _ring_chunk_steps(opts))
        cut = ring_cut(coll, topo, opts) if chunked else None
        slicer = _ring_slicer(coll, opts) if chunked and in_turn else None
        ring_collective(b, kind, orders, shares, in_turn=in_turn, window=window, cut=cut, slicer=slicer, **common)
    elif algo == "tree":
        sweeps = _tree_sweeps(coll, topo, opts) if chunked else None
        common["shared_sender"] = chunked and _tree_halves_share_the_channel(coll, topo, opts)
        nccl_parts = chunked and _nccl_part_loops(opts)
        trees = _channel_trees(b, coll, topo, opts, nodes, blocks)
        # A tree edge keeps NCCL_STEPS chunks in flight under every protocol: calcCollChunking (enqueue.cc) gives a
        # tree one step a chunk, runTreeUpDown / runTreeSplit and NVLS-Tree's tree run ProtoSimple<1, 1>
        # (all_reduce.h), LL / LL128 wait for a free slot once a chunk (prims_ll*.h `waitSend`), v2.18.5-1..v2.30.7-1;
        # an LL / LL128 tree's NVLink sweeps go on behind their chunk's slot (`tree_flows`)
        window = _steps_in_flight(opts)
        for c, size in enumerate(channel_shares(coll, topo, opts)):
            which, parent = trees(c)
            if sweeps or nccl_parts:
                common["chunk_bytes"] = _tree_part_chunk(coll, topo, opts, size)
            pieces = part_chunks(size, common["chunk_bytes"]) if nccl_parts else None
            tree_flows(
                b, parent, size, c, up=True, down=True, name=f"tree{which}", sweeps=sweeps, pieces=pieces,
                window=window, **common,
            )  # fmt: skip
    elif algo == "hierarchical":
        hierarchical_all_reduce(b, blocks, coll.nbytes, ch, **common)
    elif kind in ("broadcast", "reduce"):
        root = coll.root or 0
        up, down = kind == "reduce", kind == "broadcast"
        shares = channel_shares(coll, topo, opts)
        rings = channel_rings(coll, topo, opts, nodes, blocks, len(shares)) if algo == "chain" else []
        if algo == "chain":
            _leave_by_entry_nics(b, coll, topo, opts, nodes, blocks, len(shares))
        for c, size in enumerate(shares):
            if algo == "chain":
                links = _chain_links(rotate(rings[c], rings[c].index(root)), up)
            else:
                links = [None if v == root else root for v in range(n)]
            window = _steps_in_flight(opts)  # a chain's steps in flight on each hop (broadcast.h, reduce.h)
            sweep = _chain_sweep(coll, topo, opts) if chunked and algo == "chain" else None
            sweeps = (sweep, sweep) if sweep else None
            pieces = part_chunks(size, opts.chunk_bytes) if chunked and _nccl_part_loops(opts) and not sweeps else None
            tree_flows(
                b, links, size, c, up=up, down=down, name=algo, window=window, pieces=pieces, sweeps=sweeps, **common
            )
    elif kind == "all_to_all":
        relay = pxn_relay(topo, nodes, blocks, opts)
        pairwise = algo == "pairwise"
        cmap = _p2p_channel_map(coll, topo, opts)
        all_to_all(
            b,
            n,
            coll.nbytes,
            ch,
            pairwise=pairwise,
            step_delay_ns=opts.step_latency_ns,
            name="a2a",
            relay=relay,
            channel_map=cmap,
            chunk=_p2p_chunk(coll, topo, opts, calls) if chunked else None,
            window=_steps_in_flight(opts),
            depth=_net_p2p_depth(coll, topo, opts, ch, cmap, relay) if chunked and not pairwise else None,
            grouped=nccl_settings(opts).shared_comms,  # NCCL_NET_SHARED_COMMS (no CTS outside the NCCL model)
        )
    else:
        relay = pxn_relay(topo, nodes, blocks, opts) or comm_relay(b, topo, coll, opts)
        cmap = _p2p_channel_map(coll, topo, opts)
        chunk = _p2p_chunk(coll, topo, opts, calls) if chunked else None
        send_recv(b, coll.nbytes, ch, opts.step_latency_ns, "p2p", relay, cmap, chunk, _steps_in_flight(opts))
