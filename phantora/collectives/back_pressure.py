"""NCCL's back-pressure: a connection's slot frees when its receiver's kernel has consumed the step in it.

A connection keeps NCCL_STEPS slots. The sender's kernel waits for a free one before each step (prims_simple.h,
prims_ll.h, prims_ll128.h `waitPeer`: its `step` against the connection's `head` plus NCCL_STEPS), and the receiver
raises `head` (`postPeer`) only once its own kernel has consumed the step: copied it out to its output, or reduced or
copied it into the step it sends on. So a slow edge downstream holds back every rank upstream of it, one window at
a time. The credit then travels back to the sender (NCCL v2.30.7-1):

- inside a host (P2P, SHM) the receiver's kernel writes `head` into the sender's memory: a flag crossing the link;
- across hosts (net.cc, net_ib) the receiving proxy sees `head` move, posts a receive for the freed slot, and its
  clear-to-send crosses the network to the sender's proxy, which only then writes the step; the sender's kernel
  meanwhile waits for its own staging slot, which its proxy frees when the write of the step before has completed.

`Credits` keeps one collective's connections: each message's flow, what consuming it means (by default its arrival:
a receiver that only copies it out), and returns the dependencies that free the slot of a connection's next
message: the consumption of the message `window` back plus the credit's way back. Inside a host that is a zero-byte
flow at the sender released the flag's latency later (`DagBuilder.credit_ns`; 0: no flow). Across hosts it is the
clear-to-send itself, a flow of `cts_bytes` from the receiver to the sender over the network (its NICs, the reverse
path), which queues behind what the reverse direction carries and pauses with it (PFC); the sender's next message
waits for its arrival. A sender's proxy frees its own staging slot (and a PXN relay its buffer's) when its write
completes, its ACK back across the reverse path (`Credits.acked`). The first `window` messages of such a connection
wait for the CTSs of the receives the receiving proxy posts from the call's start, one a progress turn
(`Credits.posted`); a p2p call's receives from one sending proxy on a channel are posted together, one CTS for up to
MAX_RECVS of them (`DagBuilder.grouped_cts`). A queue pair writes its CTSs in turn. Both engines see the same flows:
a tiny max-min flow in the flow engine, an RDMA write in ns-3. Its traffic class is the collective's: phantora maps
neither NCCL_IB_TC nor NCCL_IB_FIFO_TC (the CTS queue pair's own class, net_ib/connect.cc) to a class.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol

from phantora.netsim.base import Flow

if TYPE_CHECKING:
    from phantora.topology.model import Topology

CREDIT = "credit"  # the last part of a credit's tag
ACK = "ack"  # the part before it of a write's ACK on its way back (`Credits.acked`)
NCCL_STEPS = 8  # slots per connection (src/include/device.h)
MAX_RECVS = 8  # NCCL_NET_IB_MAX_RECVS (net_ib/common.h): receives one grouped irecv, and its CTS, covers at most
CTS_ENTRY_BYTES = 64  # sizeof(struct ncclIbSendFifo), net_ib/common.h (NCCL v2.29.7-1): 8+8+4x4+4+4+8+16 padding


class Builder(Protocol):
    """What `Credits` needs of a `collectives.dag.DagBuilder` (not imported: it uses this module)."""

    nodes: list[int]
    prefix: str
    credit_ns: Callable[[int, int], int] | None
    turn_ns: int

    def network(self, src: int, dst: int) -> bool: ...

    def next_id(self) -> int: ...

    def append_flow(self, f: Flow) -> int: ...

    def clear_to_send(
        self, src: int, dst: int, size: int, deps: tuple[int, ...], tag: str, channel: int, delay_ns: int = 0
    ) -> int: ...

    def grouped_cts(
        self,
        src: int,
        dst: int,
        size: int,
        deps: tuple[int, ...],
        tag: str,
        channel: int,
        step: tuple[int, int],
        delay_ns: int = 0,
    ) -> int: ...


def is_credit(f: Flow) -> bool:
    """Whether `f` is a credit on its way back: a zero-byte flow at the sender released after its latency (inside a
    host), or a clear-to-send from the receiver to the sender (across hosts, `is_cts`)."""
    return f.tag.rpartition("/")[2] == CREDIT


def is_cts(f: Flow) -> bool:
    """Whether `f` is a clear-to-send crossing the network (a credit between two endpoints, not a flag's delay)."""
    return f.src != f.dst and f.tag.rpartition("/")[2] == CREDIT


def cts_bytes(receives: int = 1) -> int:
    """The bytes of the clear-to-send that frees one message's slots: sizeof(ncclIbSendFifo), 64, once per receive
    the message covers. net_ib answers each receive the proxy posts with one inline RDMA WRITE of `nreqs x
    sizeof(ncclIbSendFifo)` into the sender's CTS FIFO (net_ib/p2p.cc `ncclIbPostFifo`); a connection's receive has
    one request (a p2p call's receives grouped over connections add theirs: `DagBuilder.grouped_cts`), and
    the proxy posts one a slice (net.cc `recvProxyProgress`: `posted += sliceSteps`): one a message, but two for a
    Simple ring chunk (`ring_receives`). 64 bytes: 8 (addr) + 8 (size) + 4 x 4 (rkeys, NCCL_IB_MAX_DEVS_PER_NIC)
    + 4 (nreqs) + 4 (tag) + 8 (idx) + 16 (padding), a 32-byte multiple as common.h asserts."""
    return CTS_ENTRY_BYTES * max(1, receives)


def ring_receives(window: int) -> int:
    """The receives a ring's chunk of NCCL_STEPS / `window` slots is posted as: its slices, SLICESTEPS =
    NCCL_STEPS / 4 slots each under Simple (collectives.h: a chunk of CHUNKSTEPS = NCCL_STEPS / 2, so 2), one for
    LL and LL128 (a chunk of one slot)."""
    return max(1, (NCCL_STEPS // max(1, window)) // (NCCL_STEPS // 4))


class Credits:
    """The connections of one builder's collective: messages in order, and when each was consumed (see the
    module). `window`: messages a connection keeps in flight (its NCCL_STEPS slots over the slots a message
    takes); `tag`: the credits' tag before "/credit" (their channel's); `channel`: theirs (a clear-to-send's
    queue pair and ECMP key); `receives`: the receives a message is posted as (`cts_bytes`); `posts`: whether the
    receiver posts receives (False: one-sided puts, whose first window waits for no clear-to-send); `grouped`:
    the connections are p2p transfers of one call whose receives the receiving proxy posts together with the other
    such connections' from the same sending proxy on the channel (`DagBuilder.grouped_cts`)."""

    def __init__(
        self,
        b: Builder,
        window: int,
        tag: str,
        channel: int = 0,
        receives: int = 1,
        posts: bool = True,
        grouped: bool = False,
    ) -> None:
        self.b = b
        self.posts = posts
        self.grouped = grouped
        self.window = max(1, window)
        self.tag = f"{b.prefix}{tag}/{CREDIT}"  # its credits' tag: the channel's, then "credit"
        self.ack_tag = f"{b.prefix}{tag}/{ACK}/{CREDIT}"  # its writes' ACKs' way back (`acked`)
        self._acks: dict[int, int] = {}
        self._writes: dict[int, tuple[int, int]] = {}  # a write across hosts a slot waits for -> its ends
        self._acked: dict[int, tuple[int, ...]] = {}  # a message -> the writes whose ACKs its consumption waits for
        self.channel = channel
        self.receives = max(1, receives)
        self.cts = cts_bytes(receives)
        self._sent: dict[Hashable, list[int]] = {}
        self._used: dict[int, tuple[int, ...]] = {}
        self._gates: dict[tuple[int, int, tuple[int, ...]], int] = {}

    def slot(self, conn: Hashable, src: int, dst: int) -> tuple[int, ...]:
        """What the next message on `conn` (position `src` to `dst`) waits for to have a free slot: the message
        `window` back consumed by `dst`, and the credit back at `src`. One of the first `window` messages finds its
        slot free: inside a host it waits for nothing, across hosts for the clear-to-send of its receive (`posted`)."""
        sent = self._sent.get(conn)
        if sent is None or len(sent) < self.window:
            return self.posted(src, dst, len(sent or ()))
        back = sent[-self.window]
        acks = tuple(a for w in self._acked.get(back, ()) for a in self.acked(*self._writes[w], w))
        return self.credit(src, dst, (*self._used.get(back, (back,)), *acks), len(sent))

    def posted(self, src: int, dst: int, step: int = 0) -> tuple[int, ...]:
        """What one of the first `window` messages of a connection `src` -> `dst` waits for: across hosts the
        clear-to-send of its receive, `self.cts` bytes from dst to src released at the call's start. The receiving
        proxy posts the first NCCL_STEPS slots' receives as soon as it has the call's op (net.cc
        `recvProxyProgress`: `posted` runs up to `done` + NCCL_STEPS ahead, `done` 0), each answered by a CTS, and
        the sending proxy writes a step only once its CTS is in (net_ib `ncclIbIsend` polls its CTS FIFO). phantora
        starts a collective's ranks together, so the receiver's side starts when the call does: the CTS is a flow
        without dependencies, which the call's first delay (NCCL's latency, `nccl/shape.py`) holds back as it holds
        the first steps. () inside a host (the slots are there), for one-sided puts (`self.posts` False: no receive
        is posted) or without `DagBuilder.credit_ns` (not NCCL's model). `step`: the message's index.

        The proxy posts those receives one a turn: each call of `recvProxyProgress` posts one receive (a slice,
        `posted += sliceSteps`) of each group of subs and returns, and the proxy thread calls each op's progress
        once a pass (proxy.cc `progressOps`). So message `step`'s CTS leaves with its first receive, step x
        `receives` turns after the first (`DagBuilder.turn_ns`, the proxy's turn: `posted_ns`)."""
        b = self.b
        if not self.posts or b.credit_ns is None or not b.network(dst, src):
            return ()
        wait = posted_ns(step, self.receives, b.turn_ns)
        if self.grouped:
            return (b.grouped_cts(dst, src, self.cts, (), self.tag, self.channel, (step, self.window), wait),)
        return (b.clear_to_send(dst, src, self.cts, (), self.tag, self.channel, wait),)

    def slots(self, conn: Hashable, src: int, dst: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """For the next message on `conn` (position `src` to `dst`): what it waits for to go (`slot`), and what the
        sender's kernel waits for to write it. Inside a host the kernel writes into the receiver's slot, so the
        same; across hosts into its own staging slot, which its proxy frees when the write of the message `window`
        back completes (net.cc `sendProxyProgress`: `ncclNet->test` done, then `sendHead`): once that write is
        acknowledged, its arrival and the ACK's way back (`acked`, made only where a consumption a credit reads
        waits for it: `forwarded`), while the proxy waits for the credit."""
        wire = self.slot(conn, src, dst)
        if not self.b.network(src, dst):
            return wire, wire
        sent = self._sent.get(conn)
        if sent is None or len(sent) < self.window:
            return wire, ()
        back = sent[-self.window]
        self.wrote(back, src, dst)
        return wire, (back,)

    def staged(self, conn: Hashable, src: int, dst: int, index: int) -> tuple[int, ...]:
        """What the sender's kernel waits for before it writes message `index` of `conn` (position `src` to `dst`)
        into its slot, when something other than the message's own flow does the writing (NVLS-Tree's reduce warps
        store the sum straight into the tree connection's slot): across hosts its own staging slot, free once the
        proxy's write `window` back is acknowledged (`acked`); inside a host the receiver's slot, free once that
        message is consumed and the credit is back (`credit`). () for one of the first `window` messages, or where
        the connection has not sent message index - window (it never does)."""
        sent = self._sent.get(conn, [])
        if index < self.window or index - self.window >= len(sent):
            return ()
        back = sent[index - self.window]
        if self.b.network(src, dst):
            return self.acked(src, dst, back)
        return self.credit(src, dst, self._used.get(back, (back,)), index)

    def writes(self, flows: tuple[int, ...]) -> tuple[int, ...]:
        """Those of `flows` that are writes across hosts whose ACK frees a slot (`wrote`)."""
        return tuple(f for f in flows if f in self._writes)

    def wrote(self, flow: int, src: int, dst: int) -> None:
        """`flow` is a write from position `src` to `dst` across hosts whose completion (its ACK back at src) frees
        a slot: a consumption names it in `consumed`'s `acked`."""
        self._writes[flow] = (src, dst)

    def acked(self, src: int, dst: int, flow: int) -> tuple[int, ...]:
        """When the sender `src` learns that its write `flow` to `dst` across hosts is complete: the RDMA write's
        completion comes with its ACK, which crosses the reverse path once the data has landed. A zero-byte flow at
        src released the path's propagation from dst to src after `flow` (`DagBuilder.credit_ns`, tagged a credit:
        a latency NCCL's measured latency holds); `flow` itself without `credit_ns` (not NCCL's model)."""
        b = self.b
        got = self._acks.get(flow)
        if got is None:
            ns = b.credit_ns(dst, src) if b.credit_ns is not None else 0
            if ns <= 0:
                return (flow,)
            node = b.nodes[src]
            got = self._acks[flow] = b.append_flow(Flow(b.next_id(), node, node, 0, (flow,), ns, self.ack_tag))
        return (got,)

    def sent(self, conn: Hashable, flow: int) -> None:
        """`flow` is the next message on `conn`; until `consumed` says otherwise its arrival consumes it."""
        self._sent.setdefault(conn, []).append(flow)

    def consumed(self, flow: int, deps: tuple[int, ...], acked: tuple[int, ...] = ()) -> None:
        """Message `flow` is consumed by its receiver once `deps` have completed (its kernel's work on it), and
        what earlier calls named (a step sent on to several peers is consumed once all have it). `acked`: writes
        across hosts (`wrote`) whose ACK's return it waits for too, made only if a credit reads the consumption."""
        self._used[flow] = tuple(dict.fromkeys((*self._used.get(flow, ()), *deps)))
        if acked:
            self._acked[flow] = (*self._acked.get(flow, ()), *acked)

    def credit(self, src: int, dst: int, deps: tuple[int, ...], step: int = 0) -> tuple[int, ...]:
        """`deps` (dst's consumption of a step) as the sender `src` learns of it: across hosts the clear-to-send,
        `self.cts` bytes from dst to src once they have completed (on the connection's CTS queue pair; `grouped`:
        message `step`'s, one for the group); inside a host a zero-byte flow at src released the credit's latency
        after them, or `deps` themselves where that is 0. No credit without `DagBuilder.credit_ns` (not NCCL's
        model)."""
        b = self.b
        if b.credit_ns is None or not deps:
            return deps
        if self.grouped and b.network(dst, src):
            return (b.grouped_cts(dst, src, self.cts, deps, self.tag, self.channel, (step, self.window)),)
        key = (src, dst, deps)
        gate = self._gates.get(key)
        if gate is not None:
            return (gate,)
        if b.network(dst, src):
            gate = b.clear_to_send(dst, src, self.cts, deps, self.tag, self.channel)
        else:
            ns = b.credit_ns(dst, src)
            if ns <= 0:
                return deps
            node = b.nodes[src]
            gate = b.append_flow(Flow(b.next_id(), node, node, 0, deps, ns, self.tag))
        self._gates[key] = gate
        return (gate,)


def posted_ns(step: int, receives: int, turn_ns: int) -> int:
    """When (ns after the call's first delay) the receiving proxy posts the first receive of message `step` of a
    connection's first window, `receives` a message (its slices), one a progress turn of `turn_ns`, the first at
    once: the message starts moving with its first slice, as a flow of its own can (its CTS has all its bytes)."""
    return step * max(1, receives) * turn_ns


def forwarded(credits: Credits, got: int, inputs: tuple[int, ...], kernel: tuple[int, ...]) -> None:
    """Message `got` is consumed as its receiver's kernel starts sending it on: once the step that sends it on has
    its `inputs` and the kernel has a slot to write it into (`kernel`: `Credits.slots`' second part). NCCL's kernel
    copies a step slice by slice (prims_simple.h), freeing the slot it reads from as it writes the next one, so
    a step's slot is free for the sender as soon as the forward is under way, not when it has landed. Across hosts
    the kernel's staging slot is free once the proxy's write a window back is acknowledged (`Credits.acked`)."""
    staging = credits.writes(kernel)
    credits.consumed(got, (*inputs, *(k for k in kernel if k not in staging)), staging)


def written(
    credits: Credits, got: int, inputs: tuple[int, ...], kernel: tuple[int, ...], flow: int, network: bool
) -> None:
    """Message `got` is consumed once its receiver's kernel has written it on as `flow` (a tree's or a chain's
    forwarding GPU, ProtoSimple<1, 1>: one slice a step; a ring's one-slot LL / LL128 step, whose head prims_ll.h
    / prims_ll128.h post (`postRecv`) once the step's lines are stored on). prims_simple.h `genericOp` posts the
    receive's head upstream (`postPeer<Recv, Send>`) only after its copy of the step into the send buffer, in step
    order. Inside a host that buffer is the receiver's slot (P2P, SHM): the copy is `flow` itself, on the wire
    behind the earlier steps of its connection (`Flow.queue`) and after the downstream's credit, so `got` is
    consumed at `flow`'s arrival, not at its release. Across hosts it is the kernel's own staging slot, written
    once `inputs` are in and the slot is free (`forwarded`), however many of its steps the proxy still has to
    send."""
    if network:
        forwarded(credits, got, inputs, kernel)
    else:
        credits.consumed(got, (flow,))


def credit_latency(topo: Topology, nodes: list[int]) -> Callable[[int, int], int]:
    """(receiver position, sender position) -> the ns a freed slot's credit takes back to the sender inside a host:
    the propagation of the path from the receiver's endpoint to the sender's (`nodes[position]`), the flag's store
    across NVLink or PCIe (across hosts the clear-to-send is a flow of its own: `Credits.credit`). Each pair read
    once."""
    seen: dict[tuple[int, int], int] = {}

    def ns(dst: int, src: int) -> int:
        a, z = nodes[dst], nodes[src]
        got = seen.get((a, z))
        if got is None:
            got = seen[a, z] = topo.path_latency_ns(topo.route(a, z)) if a != z else 0
        return got

    return ns
