"""A long live run's coordinator must not grow by a Python object per flow (bridge.completion_log).

Each flow's completion is kept for flows.csv; as a `Completion` with its own tag string and ints that was about
250 bytes a flow (a 128-rank chunked gpt_ddp step: 2.5 MiB a step). Kept as columns it is 6 x 8 bytes and a
4-byte tag index. The test runs K and 3K steps of a chunked all-reduce through a CoordinatorCore on the flow
engine and bounds the traced memory the extra 2K steps keep per flow.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from bridge.completion_log import CompletionLog
from bridge.core import CoordinatorCore
from bridge.protocol import INF_NS, completion_to_wire, decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.base import Completion
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

WORLD = 8
COLUMNS_BYTES = 6 * 8 + 4  # a kept completion: six int64 columns and a tag index


def tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def run_steps(steps: int) -> tuple[int, int, int, dict[str, Any]]:
    """`steps` chunked all-reduces of 1 MiB, each waited by every rank; after the last, with the coordinator alive:
    (gc-tracked objects, traced bytes, flows kept), then its outcome."""
    topo = leaf_spine(1, WORLD, 0, nic_rate="100Gbps", latency="1us")
    core = CoordinatorCore(
        FlowSimulator(topo),
        topo,
        WORLD,
        window_ns=0,
        algo=AlgoOptions(granularity="chunked"),
        send=lambda r, raw: None,
    )
    t = 0
    for seq in range(steps):
        for r in range(WORLD):
            core.on_message(r, decode(encode("coll", t, h=seq + 1, group=list(range(WORLD)), seq=seq,
                                             kind="all_reduce", nbytes=2**20, dtype="bf16", root=None, name="",
                                             algo=None)))  # fmt: skip
        for r in range(WORLD):
            core.on_message(r, decode(encode("wait", t, handles=[seq + 1], until=INF_NS)))
        core.progress()
        t = core.records[-1].end_ns + 1000
    objects = tracked()
    kept = tracemalloc.get_traced_memory()[0]
    flows = len(core.completions)
    for r in range(WORLD):
        core.on_message(r, decode(encode("finish", t, results={}, cpu_s=0.0)))
    return objects, kept, flows, core.finalize()


def test_a_kept_flow_costs_its_columns_not_objects() -> None:
    """K and 3K steps: the extra 2K keep no Python object a flow (a collective's record, its rendezvous and calls
    stay: cosim.json's `collectives`), and about the columns' bytes a flow. Measured: 0.04 objects and 96 bytes a
    flow (224 flows a step); before bridge.completion_log 1.04 objects and 314 bytes."""
    k = 8
    tracemalloc.start()
    try:
        run_steps(1)  # the first run's lazy imports and caches, kept by either
        o_short, b_short, f_short = run_steps(k)[:3]  # its outcome not kept while the long run is measured
        o_long, b_long, f_long, out = run_steps(3 * k)
    finally:
        tracemalloc.stop()
    assert f_long == 3 * f_short > 1000, (f_short, f_long)
    assert len(out["collectives"]) == 3 * k and len(out["completions"]) == f_long
    assert all(rec["end_ns"] > rec["t_start"] for rec in out["collectives"])
    flows = f_long - f_short
    assert (o_long - o_short) / flows < 0.2, f"{(o_long - o_short) / flows:.2f} objects kept a flow"
    assert (b_long - b_short) / flows < 3 * COLUMNS_BYTES, f"{(b_long - b_short) / flows:.0f} bytes kept a flow"


def test_the_log_gives_back_what_was_appended() -> None:
    """Equal completions, in order, and the wire rows completion_to_wire gives (lost ranges too)."""
    done = [
        Completion(7, 10, 20, 4096, 0, 1, "all_reduce#0/ring/ch0/step0"),
        Completion(8, 10, 25, 4096, 1, 2, "all_reduce#0/ring/ch0/step0"),
        Completion(9, 30, 2**40, 2**33, 3, 0, "send_recv#1", ((0, 512), (4096, 8))),
        Completion(10, 31, 40, 0, 2, 3),
    ]
    log = CompletionLog()
    assert not log and list(log) == []
    for c in done:
        log.append(c)
    assert len(log) == 4 and list(log) == done
    assert log.wire() == [completion_to_wire(c) for c in done]
