"""When a lone send that fits its connection's buffer is handed off: its sender's kernel ends there.

NCCL's send kernel (`runSend`, src/device/sendrecv.h) waits only for a free slot of its connection's NCCL_STEPS
slots, writes a step and posts it; once its last step is posted it ends, whether or not the receiver's kernel
runs (the receiver's proxy, or its kernel over P2P, drains the slots later). So a send of at most the buffer
(`chunking.eager_send_bytes`) ends, as its stream and a caller's `work.wait()` see it, at its launch plus its bytes
at the pair's p2p rate: NCCL's p2p model of the lone transfer (`nccl.p2p.p2p_choice`: one launch and step latency,
the network overhead of its proxy ops across nodes, then the bytes at the pair's rate), not when its flow ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from phantora.collectives.nccl import choose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology


def handoff_ns(
    topo: Topology, algo: AlgoOptions, over: Mapping[str, Any], src: int, dst: int, nbytes: int
) -> int | None:
    """The ns from a lone send's start to its hand-off (`src` to `dst`, `nbytes`), under the run's `algo` with a
    call's overrides `over` (its NCCL_* variables); None where NCCL's model does not time it (the ideal model)."""
    keep = {k: v for k, v in over.items() if k not in ("traffic_class", "loss_tolerance")}
    opts = dataclasses.replace(algo, **keep) if keep else algo
    choice = choose(Collective("send_recv", (src, dst), nbytes, "uint8"), topo, opts)
    if choice is None:
        return None
    return round(choice.time_us * 1000.0)
