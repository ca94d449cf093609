"""The bytes each channel of a ring, tree or chain collective carries, in nccl-tests' units (`Collective.nbytes`).

NCCL 2.22+ deals a collective's count onto its channels in unequal parts of whole cells
(`nccl.channel_split.split`: enqueue.cc `scheduleCollTasksToPlan`, v2.22.3-1 to v2.30.7-1): the parts can be fewer
than the algorithm's channels (a small collective fills a few cells) or more (up to the communicator's), and the
count's excess over whole cells comes off the last. The flows carry those parts, as NCCL's chunks and proxy steps
are sized from them (`chunking.chunk_bytes`, `proxy.steps_per_connection`). NCCL 2.20 and 2.21 split on the host
into parts aligned to the protocol's alignment, the last one short (`nccl.host_split`). A part is of the count;
all-gather's and reduce-scatter's nccl-tests size is nranks counts, so their channel carries the part times nranks.
Before 2.20, outside the NCCL model, and for phantora's own algorithms, the bytes split evenly over the channels.
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.dag import split
from phantora.collectives.nccl import TO_NCCL, channel_split, coll_group, host_split, platform_of, ring_loops
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl.channels import plan_channels
from phantora.collectives.nccl.ring_round_up import run_threads
from phantora.collectives.ring import Cut
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology

SPLIT_ALGORITHMS = ("ring", "tree", "chain")  # phantora's names of NCCL's ring, tree and (broadcast, reduce) ring
SPLIT_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
NVLS_ALGORITHMS = ("nvls", "nvls_tree")  # NCCL's NVLS scheduling kind: dealt apart, from channel 0


def channel_shares(coll: Collective, topo: Topology, opts: AlgoOptions) -> list[int]:
    """Each channel's bytes of `coll` under resolved `opts` (channel 0 first), summing to `coll.nbytes`: NCCL's
    parts where its version splits (`opts.channels` the algorithm's channels, dealt onto the communicator's from
    2.22; 2.20-2.21 the host's aligned parts), else `coll.nbytes` split evenly over `opts.channels`."""
    channels = max(1, opts.channels)
    even = split(coll.nbytes, channels)
    if opts.model != "nccl" or opts.algorithm not in SPLIT_ALGORITHMS or coll.kind not in SPLIT_KINDS:
        return even
    st = nccl_settings(opts)
    n = coll.size
    comm = plan_channels(TO_NCCL[opts.algorithm], platform_of(topo, coll.ranks, st), st)
    count = channel_split.count_bytes(coll.kind, n, coll.nbytes)
    if coll.dealt_parts:  # an aggregate of a group dealt on after the aggregates before it (`plan_parts`)
        parts: tuple[int, ...] | None = coll.dealt_parts
    elif len(coll.group_sizes) > 1:  # a group's calls dealt one after another (nccl.coll_group.deal), together
        parts = _group_parts(coll, opts, st.nccl_version, channels, max(comm, channels))
    else:
        parts = channel_split.split(st.nccl_version, coll.kind, opts.protocol, n, count, channels, max(comm, channels))
    if parts is None and host_split.applies(st.nccl_version):
        parts = host_split.split(count, channels, host_align(coll, topo, opts))
    if parts is None:
        return even
    per = channel_split.global_per_count_byte(coll.kind, n)
    shares = [part * per for part in parts]
    shares[-1] += coll.nbytes - sum(shares)  # an all-gather / reduce-scatter size that is not nranks whole counts
    return shares


def _group_parts(
    coll: Collective, opts: AlgoOptions, version: tuple[int, int], channels: int, max_channels: int
) -> tuple[int, ...] | None:
    """Each used channel's bytes of count over `coll`'s group of calls (`group_sizes`, one aggregate; `coll.nbytes`
    their total) as NCCL 2.22+ deals them one after another onto the channels, lowest channel first; None before
    2.22."""
    n, sizes = coll.size, coll.group_sizes
    calls = [(coll.kind, coll.redop, coll.dtype, s) for s in sizes]
    order = [i for agg in coll_group.aggregates(version, calls) for i in agg]  # NCCL's plan order
    counts = [channel_split.count_bytes(coll.kind, n, sizes[i]) for i in order]
    dealt = coll_group.deal(version, coll.kind, opts.protocol, n, counts, channels, max_channels)
    if dealt is None:
        return None
    return tuple(b for b in coll_group.channel_bytes(dealt) if b > 0) or (0,)


def plan_parts(
    parts: Sequence[Collective], resolved: Sequence[AlgoOptions], topo: Topology
) -> list[tuple[int, tuple[int, ...]]] | None:
    """(its first channel, the bytes of count on each used channel from it) of each of a group's aggregates NCCL
    keeps apart (`parts`, in NCCL's plan order, each under its `resolved` options), as 2.22+'s `scheduleCollTasksToPlan`
    deals a plan's tasks: the aggregates that are not NVLS one after another, the channel cursor and each channel's
    traffic shared (nccl.coll_group.deal_plan); an NVLS aggregate (dealt after them from channel 0, with its own
    channels) gets (0, ()). None where this is not NCCL's split (before 2.22, outside the NCCL model) or where an
    aggregate among the dealt runs an algorithm whose channels are not dealt so (PAT): each is then dealt alone."""
    head = resolved[0]
    if head.model != "nccl":
        return None
    st = nccl_settings(head)
    if st.nccl_version < channel_split.SPLIT_FROM:
        return None
    dealt = [i for i, o in enumerate(resolved) if o.algorithm not in NVLS_ALGORITHMS]
    if any(resolved[i].algorithm not in SPLIT_ALGORITHMS or parts[i].kind not in SPLIT_KINDS for i in dealt):
        return None
    tasks: list[tuple[str, str, int, int]] = []
    owner: list[int] = []
    most = 1
    for i in dealt:
        part, o = parts[i], resolved[i]
        n, channels = part.size, max(1, o.channels)
        p = platform_of(topo, part.ranks, st)
        most = max(most, plan_channels(TO_NCCL[o.algorithm], p, st), channels)
        for size in part.group_sizes or (part.nbytes,):
            tasks.append((part.kind, o.protocol, channel_split.count_bytes(part.kind, n, size), channels))
            owner.append(i)
    got = coll_group.deal_plan(st.nccl_version, parts[0].size, tasks, most)
    if got is None:
        return None
    out: list[tuple[int, tuple[int, ...]]] = [(0, ()) for _ in parts]
    for i in dealt:
        mine = [d for d, who in zip(got, owner, strict=True) if who == i]
        per = coll_group.channel_bytes(mine)
        first = next((c for c, b in enumerate(per) if b > 0), 0)
        out[i] = (first, tuple(b for b in per[first:] if b > 0) or (0,))
    return out


def host_align(coll: Collective, topo: Topology, opts: AlgoOptions) -> int:
    """NCCL 2.20-2.21's alignment of the channels' parts and of a ring all-reduce's last loop (bytes) for resolved
    `opts`: the protocol's, per warp or thread of a channel's threads (`ring_round_up.run_threads`)."""
    st = nccl_settings(opts)
    p = platform_of(topo, coll.ranks, st)
    threads = run_threads(coll.kind, opts.protocol, p, coll.nbytes, max(1, opts.channels), TO_NCCL[opts.algorithm])
    return host_split.align_bytes(opts.protocol, threads)


def ring_cut(coll: Collective, topo: Topology, opts: AlgoOptions) -> Cut | None:
    """How a chunked ring's slices are cut into its passes' chunks under resolved `opts`: NCCL's own loops where its
    version lays them out as `nccl.ring_loops` does (2.22+: whole grains, the last loop's chunks 16-byte aligned
    and the last of them short; 2.20-2.21: the call's chunk, the last loop aligned to `host_align`); None
    (near-equal chunks) before 2.20 and outside the NCCL model."""
    version = nccl_settings(opts).nccl_version
    if opts.model != "nccl" or not ring_loops.applies(version):
        return None
    kind = coll.kind
    align = host_align(coll, topo, opts) if host_split.applies(version) else ring_loops.LAST_LOOP_ALIGN

    def cut(slices: list[int], chunk: int) -> list[list[int]]:
        return ring_loops.ring_chunks(kind, slices, chunk, align)

    return cut
