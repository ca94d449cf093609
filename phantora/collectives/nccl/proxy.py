"""The proxy's service of a GPU's network connections: a bound on the step rate that NCCL's model leaves out.

Every network step of a ring or tree passes through the proxy thread of the GPU that owns the connection: one
progress thread per GPU (src/proxy.cc `ncclProxyProgress`) walks its list of active operations, one per channel
and connection (collective connections are not shared, so `ProxyAppend` groups no subs: each has its own args),
calling each one's progress function once per pass (`progressOps`); net.cc's `sendProxyProgress` and
`recvProxyProgress` (v2.22.3-1 to v2.30.7-1) advance a connection by one action per call: post a receive buffer
(`irecv`, whose credit the sender's `isend` waits for), hand the GPU's step to the network (`isend`), test a
completion. So a GPU's proxy spends a fixed time on every step of every network connection it owns, one after
another, and a collective of many channels and small steps (LL and LL128 across hosts) waits for it.

Closed form: the proxy's turns overlap the transfer and bound its throughput. net.cc's `sendProxyProgress`
posts step s while `sub->posted < sub->done + maxDepth` (maxDepth = NCCL_STEPS = 8, device.h) and sends it while
`sub->transmitted < sub->done + NCCL_STEPS`; `recvProxyProgress` the same (v2.30.7-1): up to 8 steps of a
connection are on the wire while the proxy serves the next, and the kernel waits only for one of its NCCL_STEPS
slots to free (prims_ll128.h `waitSend`). So the proxy is a server in the pipeline, not a stage after it: the busiest
GPU's turns (its network connection-steps times `PROXY_STEP_US`) are hidden while the wire is slower, and the call
costs max(turns, transfer). The transfer is the one the network simulates (which may run slower than NCCL's model,
or share its links), so the turns are a floor on the time each network connection spreads its bytes over (a rate
cap, `shape.py`; `floor_us`: less the part of NCCL's tree correction that is no pipeline fill, a bandwidth factor
the turns overlap too), not a delay; `Choice.proxy_us`, what they exceed NCCL's own transfer by
(`max(0, floor - bytes / algbw)`), is the closed form's share. (Until 2026-11-30 that excess was the delay, so a
transfer slower than the model's was charged on top of it: time fell with the size, e.g. a forced ring LL128
broadcast on testbed16, 20.89 / 20.80 / 20.64 µs at 128 / 256 / 512 KiB.)
- *Connections per GPU*: a channel's connections land on the GPU of the NIC it uses (the search spreads
  channels over the node's NICs, one GPU each on rail-optimised hosts), so a node's connections are shared by
  min(ppn, NICs) proxies. A ring (NCCL puts a node's GPUs together on it, connect.cc) has one network send and
  one network receive per channel and node. A tree channel has, at each node, one connection each way (up and
  down) per network edge of its tree: NCCL's double binary tree (graph/trees.cc `ncclGetDtree`: `ncclGetBtree`,
  then the same tree mirrored for an even node count, shifted for an odd one); `connectTrees` puts tree 0 on the
  search's channels and tree 1 on their copies, and further copies (NCCL_MIN_CTAS) repeat the channels they copy
  (`tree_channels.tree_counts`, the mapping the flows use).
  The busiest node bounds: on 4 and 8 nodes an inner node of one tree (parent and two children: 6 connections
  a channel) that is a leaf of the other (2).
- *Steps per connection*: `ncclProxyOp.nsteps` (enqueue.cc `calcCollChunking`): the pattern's steps per loop
  (ring all-reduce 2 (n - 1), all-gather and reduce-scatter n - 1, tree 1) times the loops (the bytes over
  channels x chunks per loop x chunk; from NCCL 2.22 the busiest channel's own part over chunks per loop x its
  chunk, `channel_split`), counted in the proxy's slices (chunkSteps / sliceSteps per step).

Charged on LL and LL128 only, on top of NCCL's time (the tuner's choice keeps NCCL's model). NCCL's model
charges the proxy once per step as `max(hop, netOverhead)` (`getNetOverhead`: 1 µs on Intel hosts, 2 on AMD), as
if one connection were served; its Simple ring across nodes takes three times that a step and its plateau factor
(x 1.4 latency, a fit of measured inter-node rings), and a Simple step is a slice of up to 512 KiB whose transfer
hides the proxy's turn: with the bound charged on Simple too, none of the compared tables moves, but a forced
Ring/Simple 1 MiB all-reduce on testbed16 goes from 191.85 to 328.48 µs (2026-11-30), the turns counted twice. So
Simple is charged only the slices a smaller NCCL_BUFFSIZE adds over NCCL's 4 MiB buffer (`simple_extra_us`).

`PROXY_STEP_US` is fitted on the compared tables (in-sample), not NCCL's: over every compared table (bench
`bench_nccl_tests.py --summary`) 0.45-0.65 µs leave the fewest sizes out of the goal (59; 0.3: 63, 0.8: 64, 1.0:
67) and 0.6-0.8 the most tables meeting it at every size (32 of 50); 0.6, in both, is kept. Beyond a few MiB the
transfer hides the turns and the bound charges nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace

from phantora.collectives.layout import dbt_parents
from phantora.collectives.nccl import channel_split, ring_kernel, tree_channels
from phantora.collectives.nccl.channels import plan_channels
from phantora.collectives.nccl.chunking import chunk_bytes, step_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

PROXY_STEP_US = 0.6  # µs of the proxy's turn on one network step of one connection (fitted, see above)
PROXY_PROTOCOLS = ("LL", "LL128")
RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
RING_CHUNK_STEPS = {"LL": 1, "LL128": 1, "Simple": ring_kernel.RING_CHUNK_STEPS}  # chunkSteps of ring collectives
RING_SLICE_STEPS = {"LL": 1, "LL128": 1, "Simple": 2}  # sliceSteps (Simple: NCCL_STEPS / 4): the proxy's unit
STEPPED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")  # the kinds those steps are for


def ring_steps(kind: str, proto: str) -> tuple[int, int]:
    """(chunkSteps, sliceSteps) of a ring collective: ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS and SLICESTEPS
    under Simple; broadcast and reduce take BROADCAST/REDUCE_CHUNKSTEPS = SLICESTEPS = 1 (collectives.h,
    v2.30.7-1); LL and LL128 one step a chunk."""
    if kind not in STEPPED_KINDS:
        return 1, 1
    return RING_CHUNK_STEPS[proto], RING_SLICE_STEPS[proto]


def btree_parents(n: int) -> list[int]:
    """Each node's parent in NCCL's binary tree of `n` nodes (`ncclGetBtree`; -1 for the root, node 0)."""
    return [-1 if p is None else p for p in dbt_parents(n, 0)]


def dtree_edges(n: int) -> tuple[list[int], list[int]]:
    """Network edges (parent and children) of each node in NCCL's two trees (`ncclGetDtree`: `layout.dbt_parents`)."""
    out = []
    for which in (0, 1):
        edges = [0] * n
        for rank, up in enumerate(dbt_parents(n, which)):
            if up is not None:
                edges[rank] += 1
                edges[up] += 1
        out.append(edges)
    return out[0], out[1]


def connections_per_gpu(algo: str, p: Platform, st: NcclSettings, channels: int) -> float:
    """Network connections the busiest GPU's proxy serves, on the collective's first `channels` channels (their
    trees from `tree_channels.tree_counts`)."""
    gpus = max(1, min(p.ppn, p.nics_per_node or p.ppn))
    if algo == "ring":
        return 2 * channels / gpus
    if algo == "tree":
        c0, c1 = tree_channels.tree_counts(p, st, channels)
        e0, e1 = dtree_edges(p.nnodes)
        return max(2 * (c0 * a + c1 * b) for a, b in zip(e0, e1, strict=True)) / gpus
    return 0.0


def steps_per_connection(kind: str, algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ch: int) -> int:
    """The proxy's steps (slices) on one connection: steps per loop x loops x chunkSteps / sliceSteps."""
    if nbytes <= 0 or ch < 1:
        return 0
    comm = plan_channels(algo, p, st)  # the algorithm's `ch` dealt onto the communicator's channels
    part = channel_split.busiest(st.nccl_version, kind, proto, p.nranks, nbytes, ch, comm)
    if part is not None:  # from 2.22 each channel's steps come from its own part: the busiest's
        nbytes, ch = part[0], 1
    if algo == "tree":
        chunk = chunk_bytes("tree", proto, p, st, nbytes, ch)
        return math.ceil(nbytes / (ch * chunk))
    chunk_steps, slice_steps = ring_steps(kind, proto)
    step = step_bytes(proto, st)
    chunk = step // 2 if proto == "LL" else step // 16 * 15 if proto == "LL128" else step
    chunk *= chunk_steps
    n = p.nranks
    per_loop = 2 * (n - 1) if kind == "all_reduce" else n - 1 if kind in ("all_gather", "reduce_scatter") else 1
    chunks_per_loop = n if kind in ("all_reduce", "all_gather", "reduce_scatter") else 1
    loops = math.ceil(nbytes / (ch * chunks_per_loop * chunk))
    return per_loop * loops * chunk_steps // slice_steps


def service_us(kind: str, algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ch: int) -> float:
    """The busiest proxy's time (µs) on the collective's network steps (0 inside one node); under Simple, on the
    steps a smaller NCCL_BUFFSIZE adds (`simple_extra_us`)."""
    if proto == "Simple":
        return simple_extra_us(kind, algo, p, st, nbytes, ch)
    if p.nnodes < 2 or proto not in PROXY_PROTOCOLS:
        return 0.0
    if not ((algo == "ring" and kind in RING_KINDS) or (algo == "tree" and kind == "all_reduce")):
        return 0.0
    conns = connections_per_gpu(algo, p, st, ch)
    return conns * steps_per_connection(kind, algo, proto, p, st, nbytes, ch) * PROXY_STEP_US


def simple_extra_us(kind: str, algo: str, p: Platform, st: NcclSettings, nbytes: int, ch: int) -> float:
    """The busiest proxy's turns (µs) on the network slices a Simple collective takes beyond those of NCCL's 4 MiB
    buffer: NCCL_BUFFSIZE sets the step (buffSize / NCCL_STEPS, enqueue.cc `calcCollChunking`), so a smaller
    buffer cuts the bytes into more slices, each a turn of the proxy. NCCL's model charges Simple's proxy per step
    in its latency (3 x the net overhead) and its plateau factor, fitted at the default buffer: only the slices
    beyond those are the proxy's own (none at the default or a larger buffer)."""
    if p.nnodes < 2 or not st.buffsize:
        return 0.0
    if not ((algo == "ring" and kind in RING_KINDS) or (algo == "tree" and kind == "all_reduce")):
        return 0.0
    steps = steps_per_connection(kind, algo, "Simple", p, st, nbytes, ch)
    steps -= steps_per_connection(kind, algo, "Simple", p, replace(st, buffsize=0), nbytes, ch)
    return connections_per_gpu(algo, p, st, ch) * max(0, steps) * PROXY_STEP_US


def floor_us(turns_us: float, fit_us: float, fill_us: float) -> float:
    """The least time (µs) the network connections' bytes take, beyond the delay before them: the turns, less the
    part of NCCL's tree correction (`fit_us`, in its latency) that is not the model's pipeline fill (`fill_us`,
    before `select` nets it against the correction). The correction is a bandwidth factor: beyond the fill it is
    a throughput shortfall of the transfer, which the turns overlap like the rest of it; the fill comes first."""
    return max(0.0, turns_us - max(0.0, fit_us - fill_us))


def excess_us(turns_us: float, transfer_us: float) -> float:
    """What the busiest proxy's turns add to a transfer they overlap (up to NCCL_STEPS steps in flight per
    connection): nothing while the wire is slower, the difference when the proxy is."""
    return max(0.0, turns_us - transfer_us)
