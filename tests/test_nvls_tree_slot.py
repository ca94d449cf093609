"""NVLS-Tree's NVLS reduce waits for a free slot of the tree connection it writes into.

all_reduce.h (NCCL_ALGO_NVLS_TREE, v2.29.7-1): a head's reduce warps load-reduce loop k's chunk through the switch
and store the sum straight into the tree connection's send buffer in one `directRecvDirectSend` call, whose
prims_simple.h `waitPeer` first waits for one of the connection's NCCL_STEPS slots. Across hosts that buffer is the
sender's own staging buffer, whose slot the proxy frees once its write of the step NCCL_STEPS back has completed
(net.cc `sendProxyProgress`: the write's completion, its ACK back across the path). So with a slow network the
NVLS reduce runs at most NCCL_STEPS loops ahead of the tree. Closed forms on 2 hosts x 2 GPUs (rail leaves, 1 µs
links, NICs at 25 Gbit/s, NVLink at 400), one channel, 2 heads, loops of 2 x 256 KiB: a tree step takes
256 KiB / 25 Gbit/s = 83,886 ns on its NIC, a loop's NVLS reduce 512 KiB / 400 Gbit/s = 10,486 ns.
"""

from __future__ import annotations

import pytest

from phantora.collectives.back_pressure import credit_latency
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.nccl.nvls_tree_loops import head_loops
from phantora.collectives.nvls import nvls_tree_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology, rail_optimized
from tests.engine_pair import start_end_ns

KiB = 1 << 10
NCCL_STEPS = 8  # src/include/device.h
CHUNK = 256 * KiB
ACK_NS = 2 * 1000  # the write's ACK back: GPU - rail leaf - GPU, two 1 µs links


def nvls_tree(loops: int) -> tuple[Topology, list[Flow]]:
    """The chunked NVLS-Tree flows of `loops` loops of 2 x 256 KiB on 2 hosts x 2 GPUs, NCCL_STEPS in flight."""
    topo = rail_optimized(2, 2, spines=1, nic_rate="25Gbps", nvlink_rate="400Gbps", latency="1us")
    gpus = list(topo.endpoints)
    b = DagBuilder(gpus, tuple(range(4)), 0, "", comm=communicator_id("nvls_tree", range(4)))
    b.host_of = {g: topo.nodes[g].host for g in gpus}
    b.credit_ns = credit_latency(topo, gpus)
    size = 2 * CHUNK * loops
    nvls_tree_flows(b, [[0, 1], [2, 3]], size, 1, window=NCCL_STEPS, head_loops=[head_loops(size, CHUNK, 2)])
    return topo, b.finish().flows


def loop_of(f: Flow) -> int:
    return int(f.tag.rsplit("chunk", 1)[1])


def reduces(flows: list[Flow], host: int) -> dict[int, list[Flow]]:
    """Loop -> the host's NVLS reduce flows of it."""
    out: dict[int, list[Flow]] = {}
    for f in flows:
        if f.tag.startswith(f"nvls_tree/intra/h{host}/reduce/chunk"):
            out.setdefault(loop_of(f), []).append(f)
    return out


def tree_sends(flows: list[Flow], gpu: int, phase: str) -> list[Flow]:
    """GPU `gpu`'s tree steps up (or down), in loop order."""
    tree = [f for f in flows if f.src == gpu and f.size and f.tag.startswith("nvls_tree/inter")]
    got = [f for f in tree if f"/{phase}/" in f.tag]
    return sorted(got, key=loop_of)


def test_a_slow_tree_holds_the_nvls_reduce_to_nccl_steps_loops_ahead() -> None:
    """32 loops. The leaf host (1) sends its sums up: its reduce of loop k >= 8 starts once the up step k - 8 of
    both its heads has ended and its ACK is back, 2,000 ns later, exactly then (the NVLink is 8 times the NIC); the
    root host (0) sends them down, so its reduce of loop k waits for its down step k - 8 the same way. So neither
    host has more than 8 loops reduced and not yet written on: free, the reduce would have run all 32 in
    32 x 10,486 ns = 0.34 ms while the tree takes 32 x 83,886 ns = 2.7 ms."""
    topo, flows = nvls_tree(32)
    done = start_end_ns("flow", topo, flows)
    for host, phase in ((1, "up"), (0, "down")):
        loops = reduces(flows, host)
        heads = [tree_sends(flows, 2 * host + i, phase) for i in range(2)]
        assert len(loops) == 32 and all(len(steps) == 32 for steps in heads)
        for k in range(NCCL_STEPS, 32):
            freed = max(done[steps[k - NCCL_STEPS].id][1] for steps in heads) + ACK_NS
            for f in loops[k]:
                assert done[f.id][0] == pytest.approx(freed, abs=2), (host, k)
        for k in range(32):  # at loop k's reduce, the steps written on and acknowledged: at least k - 8
            start = min(done[f.id][0] for f in loops[k])
            acked = sum(1 for s in heads[0] if done[s.id][1] + ACK_NS <= start)
            assert k - acked <= NCCL_STEPS
    step = CHUNK * 8e9 / 25e9
    ups = [done[f.id][1] for f in tree_sends(flows, 2, "up")]
    assert [b - a for a, b in zip(ups[8:], ups[9:], strict=False)] == pytest.approx([step] * 23, rel=1e-3)


def test_ns3_carries_the_same_wait() -> None:
    """12 loops through ns-3 (DCQCN): the same flows, so the leaf's reduce of loop k >= 8 starts no sooner than its
    up step k - 8 has ended plus the ACK's way back."""
    topo, flows = nvls_tree(12)
    done = start_end_ns("ns3", topo, flows)
    loops = reduces(flows, 1)
    heads = [tree_sends(flows, 2 + i, "up") for i in range(2)]
    for k in range(NCCL_STEPS, 12):
        freed = max(done[steps[k - NCCL_STEPS].id][1] for steps in heads) + ACK_NS
        assert all(done[f.id][0] >= freed for f in loops[k]), k
