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
message: the consumption of the message `window` back plus the credit's way back, a zero-byte flow at the sender
released that many ns later (`DagBuilder.credit_ns`; 0: no flow). Both engines see the same flows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol

from phantora.netsim.base import Flow

if TYPE_CHECKING:
    from phantora.topology.model import Topology

CREDIT = "credit"  # the last part of a credit's tag


class Builder(Protocol):
    """What `Credits` needs of a `collectives.dag.DagBuilder` (not imported: it uses this module)."""

    nodes: list[int]
    prefix: str
    credit_ns: Callable[[int, int], int] | None

    def network(self, src: int, dst: int) -> bool: ...

    def next_id(self) -> int: ...

    def append_flow(self, f: Flow) -> int: ...


def is_credit(f: Flow) -> bool:
    """Whether `f` is a credit on its way back (a zero-byte flow at the sender, released after its latency)."""
    return f.size == 0 and f.src == f.dst and f.tag.rpartition("/")[2] == CREDIT


class Credits:
    """The connections of one builder's collective: messages in order, and when each was consumed (see the
    module). `window`: messages a connection keeps in flight (its NCCL_STEPS slots over the slots a message
    takes); `tag`: the credits' tag before "/credit" (their channel's)."""

    def __init__(self, b: Builder, window: int, tag: str) -> None:
        self.b = b
        self.window = max(1, window)
        self.tag = f"{b.prefix}{tag}/{CREDIT}"  # its credits' tag: the channel's, then "credit"
        self._sent: dict[Hashable, list[int]] = {}
        self._used: dict[int, tuple[int, ...]] = {}
        self._gates: dict[tuple[int, tuple[int, ...]], int] = {}

    def slot(self, conn: Hashable, src: int, dst: int) -> tuple[int, ...]:
        """What the next message on `conn` (position `src` to `dst`) waits for to have a free slot: the message
        `window` back consumed by `dst`, and the credit back at `src`; () while the connection has free slots."""
        sent = self._sent.get(conn)
        if sent is None or len(sent) < self.window:
            return ()
        back = sent[-self.window]
        return self.credit(src, dst, self._used.get(back, (back,)))

    def slots(self, conn: Hashable, src: int, dst: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """For the next message on `conn` (position `src` to `dst`): what it waits for to go (`slot`), and what the
        sender's kernel waits for to write it. Inside a host the kernel writes into the receiver's slot, so the
        same; across hosts into its own staging slot, free once the message `window` back has arrived (its proxy
        frees it when that write completes, net.cc `sendProxyProgress`), while the proxy waits for the credit."""
        wire = self.slot(conn, src, dst)
        if not self.b.network(src, dst):
            return wire, wire
        sent = self._sent.get(conn)
        return wire, ((sent[-self.window],) if sent is not None and len(sent) >= self.window else ())

    def sent(self, conn: Hashable, flow: int) -> None:
        """`flow` is the next message on `conn`; until `consumed` says otherwise its arrival consumes it."""
        self._sent.setdefault(conn, []).append(flow)

    def consumed(self, flow: int, deps: tuple[int, ...]) -> None:
        """Message `flow` is consumed by its receiver once `deps` have completed (its kernel's work on it), and
        what earlier calls named (a step sent on to several peers is consumed once all have it)."""
        self._used[flow] = tuple(dict.fromkeys((*self._used.get(flow, ()), *deps)))

    def credit(self, src: int, dst: int, deps: tuple[int, ...]) -> tuple[int, ...]:
        """`deps` (dst's consumption of a step) as the sender `src` learns of it: a zero-byte flow at src released
        the credit's latency after them, or `deps` themselves where it is 0."""
        ns = self.b.credit_ns(dst, src) if self.b.credit_ns is not None else 0
        if ns <= 0 or not deps:
            return deps
        key = (src, deps)
        gate = self._gates.get(key)
        if gate is None:
            b = self.b
            node = b.nodes[src]
            gate = b.append_flow(Flow(b.next_id(), node, node, 0, deps, ns, self.tag))
            self._gates[key] = gate
        return (gate,)


def forwarded(credits: Credits, got: int, inputs: tuple[int, ...], kernel: tuple[int, ...]) -> None:
    """Message `got` is consumed as its receiver's kernel starts sending it on: once the step that sends it on has
    its `inputs` and the kernel has a slot to write it into (`kernel`: `Credits.slots`' second part). NCCL's kernel
    copies a step slice by slice (prims_simple.h), freeing the slot it reads from as it writes the next one, so
    a step's slot is free for the sender as soon as the forward is under way, not when it has landed."""
    credits.consumed(got, (*inputs, *kernel))


def credit_latency(topo: Topology, nodes: list[int]) -> Callable[[int, int], int]:
    """(receiver position, sender position) -> the ns a freed slot's credit takes back to the sender: the
    propagation of the path from the receiver's endpoint to the sender's (`nodes[position]`), the flag's store
    across NVLink or PCIe inside a host, the proxy's clear-to-send across the network. Each pair read once."""
    seen: dict[tuple[int, int], int] = {}

    def ns(dst: int, src: int) -> int:
        a, z = nodes[dst], nodes[src]
        got = seen.get((a, z))
        if got is None:
            got = seen[a, z] = topo.path_latency_ns(topo.route(a, z)) if a != z else 0
        return got

    return ns
