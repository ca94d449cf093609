"""A PXN relay's two hops, step by step: each network step sends what its NVLink step wrote into the relay's buffer.

Under PXN the sender's kernel writes step s over NVLink into the relay GPU's proxy buffer (NCCL's shared p2p
buffer) and then raises the connection's tail; the relay's proxy posts the network send of step s only once the
step's size is in the connection's FIFO and the tail has passed it (net.cc `sendProxyProgress`, NCCL v2.29.7-1:
`connFifo[buffSlot].size != -1 && *recvTail > tail` before `ncclNet->isend`). So network step s waits for NVLink
step s's end, the tail's store across NVLink and the proxy's turn that polls it (as `back_pressure.Credits` models
a flag: a zero-byte flow at the relay released the path's propagation and the turn later, 50 + 600 ns on an H100
NVSwitch, `DagBuilder.turn_ns`), as well as for its own slot (the
receiver's clear-to-send). The slot of NVLink step s + window frees once network step s is done
(`sendProxyProgress` posts a slot to the kernel while `posted < done + maxDepth`; `done` moves when the isend's
test completes, its write acknowledged: `Credits.acked`, the ACK's way back from the receiver) and the credit is
back at the sender. Step s's NVLink flow, tail and network flow are made in turn, so every flow depends only on
flows made before it. Each part's first NVLink step runs within NCCL's measured latency (`relay_fill`,
nccl/idle_chain.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phantora.collectives.back_pressure import CREDIT, Credits
from phantora.netsim.base import Flow

_TAIL, _FIRST_TAIL = f"/pxn/tail/{CREDIT}", f"/pxn/first-tail/{CREDIT}"  # a step's tail's tag ends; the first's

if TYPE_CHECKING:
    from phantora.collectives.dag import DagBuilder


def relayed_chunks(
    b: DagBuilder,
    src: int,
    via: int,
    dst: int,
    sizes: list[int],
    tag: str,
    channel: int,
    deps: tuple[int, ...] = (),
    delay_ns: int = 0,
    window: int = 1,
    grouped: bool = False,
) -> tuple[list[int], list[int]]:
    """One channel's part of a transfer `src` -> `dst` relayed by `via`, in steps of `sizes`: (the NVLink steps'
    ids, src -> via, tagged `tag`/pxn; the network steps', via -> dst, tagged `tag`). The NVLink steps take the
    transfer's `deps` and `delay_ns` (the first `window` of them, or the first alone under one step in flight);
    the network steps start from their NVLink step's tail. `window`: steps in flight on each hop (one without a
    communicator, and a lone step is a message each hop with no slot, as `DagBuilder.add_chunks` makes them);
    `grouped`: the receiver posts each network step's receive with the call's other grouped transfers from the
    relay (`DagBuilder.grouped_cts`)."""
    window = window if b.comm and len(sizes) > 1 else 1
    near = Credits(b, window, f"{tag}/pxn", channel)  # the relay's buffer, inside the host: no receives posted
    far = Credits(b, window, tag, channel, grouped=grouped)
    many = len(sizes) > 1
    nvlink: list[int] = []
    net: list[int] = []
    for c, size in enumerate(sizes):
        step = f"/chunk{c}" if many else ""
        if window <= 1:  # one at a time: the next once the relay has sent the one before
            wrote, wait = ((nvlink[-1], *far.acked(via, dst, net[-1])), 0) if c else (deps, delay_ns)
            nvlink.append(b.add(src, via, size, f"{tag}/pxn{step}", channel, wrote, wait))
            tail = _tail(b, src, via, nvlink[-1], tag, not c)
            net.append(b.add(via, dst, size, f"{tag}{step}", channel, (*tail, *net[-1:]), 0, src))
            continue
        wrote, wait = ((*deps, *near.slot(0, src, via)), delay_ns) if c < window else (near.slot(0, src, via), 0)
        nvlink.append(b.add(src, via, size, f"{tag}/pxn{step}", channel, wrote, wait, None, True))
        near.sent(0, nvlink[-1])
        tail = _tail(b, src, via, nvlink[-1], tag, not c)  # the relay's proxy sees step c in its buffer
        net.append(b.add(via, dst, size, f"{tag}{step}", channel, (*tail, *far.slot(0, via, dst)), 0, src, True))
        far.sent(0, net[-1])
        near.wrote(net[-1], via, dst)  # its slot frees once the relay's send of it is done (acknowledged)
        near.consumed(nvlink[-1], (nvlink[-1],), (net[-1],))
    return nvlink, net


def is_tail(f: Flow) -> bool:
    """Whether `f` is a relay's tail: the flag that shows its proxy an NVLink step in its buffer."""
    return f.tag.endswith(_TAIL) or f.tag.endswith(_FIRST_TAIL)


def relay_fill(flows: list[Flow]) -> dict[int, Flow]:
    """The NVLink steps that start a relayed part (each part's first step, whose tail starts the network leg) by
    id -> their tails: the relay's fill, which runs within NCCL's measured latency (`nccl/idle_chain.py`)."""
    return {f.deps[0]: f for f in flows if f.tag.endswith(_FIRST_TAIL)}


def _tail(b: DagBuilder, src: int, via: int, wrote: int, tag: str, first: bool) -> tuple[int, ...]:
    """What the relay's proxy waits for to see the step `wrote` in its buffer: its end and the tail's store from the
    sender to the relay, and the relay's proxy's turn that sees it (it polls the tail once a progress call,
    `sendProxyProgress`): a zero-byte flow at the relay released `DagBuilder.credit_ns` + `turn_ns` later (tagged a
    credit: a flag's latency and a turn, which NCCL's measured latency holds; `first`: the part's first step)."""
    ns = b.credit_ns(src, via) + b.turn_ns if b.credit_ns is not None else 0
    node = b.nodes[via]
    name = f"{b.prefix}{tag}{_FIRST_TAIL if first else _TAIL}"
    return (b.append_flow(Flow(b.next_id(), node, node, 0, (wrote,), ns, name)),)
