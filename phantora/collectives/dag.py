"""`FlowDag`, the result of decomposing a collective, and `DagBuilder`, which the algorithms use to make one."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from phantora.collectives.back_pressure import MAX_RECVS, Credits
from phantora.collectives.rank_last import rank_last
from phantora.errors import InputError
from phantora.netsim.base import Flow, new_flow

MAX_FLOWS = 1_000_000  # per collective: beyond this a DAG costs GBs; coarse granularity is the answer


@dataclass
class FlowDag:
    """Point-to-point flows of one collective.

    `flows` have ids ``first_flow_id .. next_id - 1`` and depend only on flows of this DAG.
    `rank_last[r]` lists the flows whose completion means global rank r is done; an empty list
    means the rank is done as soon as the collective starts (n == 1, nbytes == 0, or a rank that
    takes no part in the traffic).
    """

    flows: list[Flow]
    rank_last: dict[int, list[int]]
    next_id: int
    choice: dict[str, Any] | None = None  # what NCCL's model chose (algorithm, protocol, channels, times); see nccl/


def ecmp_key(src: int, dst: int, channel: int) -> int:
    """ECMP hash key of one connection: one per (channel, src node, dst node), like one NCCL queue pair.

    The key does not depend on the collective, so repeated collectives reuse their paths, as NCCL's
    persistent connections do; different channels get different keys and so spread over ECMP paths.
    """
    return (channel << 48) | (src << 24) | dst


def communicator_id(family: str, ranks: Sequence[int]) -> int:
    """A stable 63-bit id of one NCCL connection set: the algorithm family (ring, tree, p2p, ...) of one group.

    NCCL connects each communicator once per family (the ring's and the tree's peers have their own connections,
    p2p has its own) and keeps those queue pairs for the communicator's life. Not Python's `hash`: the id must be
    the same in every process and run.
    """
    text = family + ":" + ",".join(map(str, ranks))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


@lru_cache(maxsize=1 << 16, typed=True)
def connection_id(comm: int, src: int, dst: int, channel: int, qp: int = 0) -> int:
    """Queue pair `qp` of one channel's connection from endpoint `src` to endpoint `dst` in communicator `comm`
    (never 0; qp 0 is the connection's only queue pair by default). Kept for the run's next collectives on the same
    communicator (a pure function of its arguments)."""
    text = f"{comm}:{channel}:{src}:{dst}" + (f":{qp}" if qp else "")
    return (int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1) | 1


CTS_QP = -1  # `connection_id`'s queue pair of a connection's clear-to-sends: no data queue pair's index
IB_WRITE_ALIGN = 128  # net_ib: a message split over queue pairs goes in parts of a multiple of 128 bytes


def qp_parts(size: int, qps: int) -> list[int]:
    """NCCL_IB_SPLIT_DATA_ON_QPS: `size` over `qps` queue pairs, as net_ib posts it: parts of
    ceil(ceil(size / qps) / 128) x 128 bytes, the last ones shorter or empty (empty parts left out)."""
    per_qp = -(-size // qps)
    part = -(-per_qp // IB_WRITE_ALIGN) * IB_WRITE_ALIGN
    return [n for n in (min(part, size - i * part) for i in range(qps)) if n > 0]


MessageCounters = dict[tuple[int, int, int, int], int]
"""Messages posted so far per network connection, (communicator, src, dst, channel) -> count. NCCL's counter that
picks a message's queue pair runs for the communicator's life, so the owner of a run's collectives keeps one of
these across `decompose` calls."""


def split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal integers (the first ``total % parts`` get one more)."""
    q, r = divmod(total, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def chunks_of(total: int, chunk: int) -> list[int]:
    """`total` cut into ceil(total / chunk) near-equal chunks (one, of 0 bytes, when total is 0)."""
    return split(total, max(1, -(-total // max(1, chunk))))


@dataclass
class DagBuilder:
    """Allocates flow ids, maps group positions to endpoint nodes, and collects flows."""

    nodes: list[int]  # endpoint node of each group position
    ranks: tuple[int, ...]  # global rank of each group position
    first_id: int
    prefix: str  # tag prefix, "" or "coll7/"
    comm: int = 0  # `communicator_id` of the collective's connections; 0 = each flow a queue pair of its own
    host_of: dict[int, object] = field(default_factory=dict)  # endpoint -> host (None: a host of its own)
    qps: int = 1  # NCCL_IB_QPS_PER_CONNECTION: queue pairs per network connection (between hosts)
    split_qps: bool = False  # NCCL_IB_SPLIT_DATA_ON_QPS: every message over all of them (else each on one, in turn)
    sent: MessageCounters = field(default_factory=dict)  # messages so far per connection (the run's, if given)
    flows: list[Flow] = field(default_factory=list)
    # (s, d, connection key, qp, channel) -> (its conn, its connection's qp 0's conn, its ECMP key)
    _conns: dict[tuple[int, int, int, int, int], tuple[int, int, int]] = field(default_factory=dict)
    whole: dict[int, int] = field(default_factory=dict)  # a queue pair's conn -> its connection's (its qp 0's)
    helpers: int = 0  # trailing positions of ranks outside the group that only relay (`add_helper`)
    # (channel, src, dst) -> the position whose NIC the hop leaves by, where it is not src's own (NCCL's ring leaving
    # an NCCL node of SHM GPUs through its channel's entry NIC: nccl/ring_nics.py); `left_by`: flow id -> that node
    exits: dict[tuple[int, int, int], int] = field(default_factory=dict)
    left_by: dict[int, int] = field(default_factory=dict)
    # (channel, src, dst) -> the position whose NIC the hop arrives at, where it is not dst's own (the same NIC of
    # the next NCCL node); `arrived_at`: flow id -> that node
    arrivals: dict[tuple[int, int, int], int] = field(default_factory=dict)
    arrived_at: dict[int, int] = field(default_factory=dict)
    # (receiver position, sender position) -> ns a slot's credit takes back to its sender (back_pressure.py); None:
    # no return latency
    credit_ns: Callable[[int, int], int] | None = None
    # ns of a proxy's progress turn (nccl/proxy.py PROXY_STEP_US): a receiving proxy posts one receive of a
    # connection's first window a turn, a relay's proxy sees a step's tail a turn after its store; 0: no turns
    turn_ns: int = 0
    # (receiver position, sending proxy's position, channel, (step, window)) -> (its grouped receives' CTS flow,
    # the receives in it)
    grouped: dict[tuple[int, int, int, tuple[int, int]], tuple[int, int]] = field(default_factory=dict)

    def add(
        self,
        src: int,
        dst: int,
        size: int,
        tag: str,
        channel: int,
        deps: tuple[int, ...] = (),
        delay_ns: int = 0,
        origin: int | None = None,
        ordered: bool = False,
        queue: int = 0,
        part: bool = False,
    ) -> int:
        """Add a flow from group position `src` to position `dst`; return its id. `origin`: the position whose part
        `src` relays (NCCL's PXN): the relay holds a connection of its own per sender, as NCCL's proxy does, so
        relayed parts of different senders are not messages of one queue pair. `ordered`: on the wire after the
        connection's ordered messages released before it (`Flow.queue`: `queue`, else the connection's; needs
        `comm`). `part`: a further part of the connection's message before it (the lines of one step as they land),
        on that message's queue pair and not counted as a message of its own."""
        if not self.exits and not self.arrivals:  # (every hop by its own NICs)
            return self._add(src, dst, size, tag, channel, deps, delay_ns, origin, ordered, queue, part)
        start = len(self.flows)
        fid = self._add(src, dst, size, tag, channel, deps, delay_ns, origin, ordered, queue, part)
        via = self.exits.get((channel, src, dst)) if self.exits else None
        if via is not None:
            s = self.nodes[src]
            self.left_by.update({f.id: self.nodes[via] for f in self.flows[start:] if f.src == s})
        into = self.arrivals.get((channel, src, dst)) if self.arrivals else None
        if into is not None:
            d = self.nodes[dst]
            self.arrived_at.update({f.id: self.nodes[into] for f in self.flows[start:] if f.dst == d})
        return fid

    def add_hops(
        self,
        srcs: Sequence[int],
        dsts: Sequence[int],
        sizes: Sequence[int],
        deps: Sequence[tuple[int, ...]],
        tag: str,
        channel: int,
        delay_ns: int = 0,
    ) -> list[int]:
        """`add(srcs[i], dsts[i], sizes[i], tag, channel, deps[i], delay_ns)` for each i in turn; return their ids.
        Where each hop is one flow on its own NICs (no exits or arrivals, one queue pair a connection) the flows are
        made in one loop, each as `add` makes it."""
        flows, nodes = self.flows, self.nodes
        if self.exits or self.arrivals or self.qps != 1 or len(flows) + len(srcs) > MAX_FLOWS:
            hops = zip(srcs, dsts, sizes, deps, strict=True)
            return [self.add(src, dst, size, tag, channel, dep, delay_ns) for src, dst, size, dep in hops]
        out: list[int] = []
        put, first, full = out.append, self.first_id, self.prefix + tag
        if not self.comm:
            for src, dst, size, dep in zip(srcs, dsts, sizes, deps, strict=True):
                s, d = nodes[src], nodes[dst]
                fid = first + len(flows)
                flows.append(new_flow(fid, s, d, size, dep, delay_ns, full, ecmp_key(s, d, channel)))
                put(fid)
            return out
        conns = self._conns
        for src, dst, size, dep in zip(srcs, dsts, sizes, deps, strict=True):
            s, d = nodes[src], nodes[dst]
            known = conns.get((s, d, channel, 0, channel)) or self._connection(s, d, channel, 0, channel)
            fid = first + len(flows)
            flows.append(new_flow(fid, s, d, size, dep, delay_ns, full, known[2], known[0]))
            put(fid)
        return out

    def _add(
        self,
        src: int,
        dst: int,
        size: int,
        tag: str,
        channel: int,
        deps: tuple[int, ...],
        delay_ns: int,
        origin: int | None,
        ordered: bool,
        queue: int,
        part: bool = False,
    ) -> int:
        """`add`, its NIC as src's own."""
        flows = self.flows
        if len(flows) >= MAX_FLOWS:
            raise InputError(
                f"this collective needs more than {MAX_FLOWS:,} flows ({len(self.ranks)} ranks); use the coarse "
                "granularity, fewer channels or bigger chunks",
                field="granularity",
            )
        s, d = self.nodes[src], self.nodes[dst]
        if not self.comm:
            fid = self.first_id + len(flows)
            flows.append(new_flow(fid, s, d, size, deps, delay_ns, self.prefix + tag, ecmp_key(s, d, channel)))
            return fid
        conn = channel if origin is None else channel | ((origin + 1) << 16)  # the connection's own id space
        qps = self.qps
        if qps == 1 or not self._network(s, d):
            msg = self._message(s, d, size, deps, delay_ns, tag, channel, 0, conn, ordered, queue)
            flows.append(msg)
            return msg.id
        if not self.split_qps:  # net_ib: message k of a connection goes on its queue pair k mod qps
            n = self.sent.get((self.comm, s, d, conn), 0)
            if part and n:  # the message before it, still on its queue pair
                n -= 1
            self.sent[self.comm, s, d, conn] = n + 1
            msg = self._message(s, d, size, deps, delay_ns, tag, channel, n % qps, conn, ordered, queue)
            return self._append(msg)
        parts = [
            self._append(self._message(s, d, n, deps, delay_ns, f"{tag}/qp{q}", channel, q, conn, ordered, queue))
            for q, n in enumerate(qp_parts(size, qps) or [0])
        ]
        if len(parts) == 1:
            return parts[0]
        # the message is done when every part is: a zero-byte flow at the receiver joins them
        return self._append(Flow(self._next(), d, d, 0, tuple(parts), 0, self.prefix + tag + "/join"))

    def add_chunks(
        self,
        src: int,
        dst: int,
        sizes: list[int],
        tag: str,
        channel: int,
        deps: tuple[int, ...] = (),
        delay_ns: int = 0,
        origin: int | None = None,
        window: int = 1,
        ready: list[tuple[int, ...]] | None = None,
        queue: int = 0,
        puts: bool = False,
        grouped: bool = False,
    ) -> list[int]:
        """A connection's messages (NCCL's steps of one channel); return their ids. One size: a plain `add`.

        `window` 1: each step once the one before has arrived, so the connection carries one at a time at its rate
        cap. `window` w > 1 (NCCL_STEPS, the connection's buffer slots): a step may go once step s - w has arrived
        and its credit is back at the sender (its slot is free: `back_pressure.Credits`) and its input is ready,
        and goes on the wire after the steps before it (`Flow.queue`: the connection sends its steps in order, on
        its queue pairs in turn), so up to w steps are in flight and none waits for the one before to arrive.
        The input: `deps` and `delay_ns` for every step (the transfer's), or `ready[s]` for step s (a step that
        forwards data received before it). `queue`: the steps' queue in place of the connection's
        (`sender_queue`). Across hosts each of the first w steps also waits for its receive's clear-to-send
        (`back_pressure.Credits.posted`), unless `puts` (one-sided writes: no receive is posted); `grouped`: the
        receiver posts step s's receive with those of the call's other grouped connections from `src` on the
        channel, one CTS for all (`grouped_cts`). Without a communicator (no connections to order): window 1. (A
        PXN relay's two hops: `relay_steps.relayed_chunks`.)"""
        if len(sizes) <= 1 and ready is None:
            return [self.add(src, dst, sum(sizes), tag, channel, deps, delay_ns, origin)]
        window = window if self.comm else 1
        credits = Credits(self, window, tag, channel, posts=not puts, grouped=grouped)  # consumed as it arrives
        out: list[int] = []
        for c, size in enumerate(sizes):
            name = f"{tag}/chunk{c}" if len(sizes) > 1 else tag
            if window <= 1:
                own = ready[c] if ready is not None else (() if out else deps)
                after = (out[-1], *own) if out else own
                wait = 0 if out and ready is None else delay_ns
                out.append(self.add(src, dst, size, name, channel, after, wait, origin))
                continue
            slot = credits.slot(0, src, dst)
            own = ready[c] if ready is not None else (() if c >= window else deps)
            wait = 0 if c >= window and ready is None else delay_ns
            out.append(self.add(src, dst, size, name, channel, (*own, *slot), wait, origin, True, queue))
            credits.sent(0, out[-1])
        return out

    def sender_queue(self, src: int, channel: int = 0) -> int:
        """The queue of everything position `src`'s kernel sends on `channel`, to any peer, one step at a time
        (`Flow.queue`): a connection id no real connection has (from the endpoint to itself)."""
        node = self.nodes[src]
        return connection_id(self.comm, node, node, channel)

    def network(self, src: int, dst: int) -> bool:
        """Whether position `src` -> position `dst` crosses hosts (NCCL's net transport)."""
        return self._network(self.nodes[src], self.nodes[dst])

    def next_id(self) -> int:
        """The id the next flow gets."""
        return self._next()

    def append_flow(self, f: Flow) -> int:
        """Add a flow made whole by the caller (id from `next_id`); return its id."""
        return self._append(f)

    def clear_to_send(
        self, src: int, dst: int, size: int, deps: tuple[int, ...], tag: str, channel: int, delay_ns: int = 0
    ) -> int:
        """Add the clear-to-send of `channel`'s connection dst -> src, `size` bytes from position `src` (the receiver)
        to `dst` (the sender) once `deps` have completed (and `delay_ns` after: a receive of the first window posted
        that many proxy turns into the call, `back_pressure.Credits.posted`); return its id (`Credits.credit`). `tag` is
        whole (prefixed). It goes on a queue pair of its own, the receiver's CTS queue pair (net_ib's
        `ncclIbRecvCommGetQpForCts`), with the reverse path's ECMP key, between the NICs the connection's steps
        leave and arrive by (`exits`, `arrivals`: a ring leaving an NCCL node by its channel's NIC). The queue
        pair writes its CTSs one at a time in the order they are posted (`Flow.queue`: the first window's, posted
        together, go in turn, in the flow engine as in ns-3's queue pair)."""
        into = self.arrivals.get((channel, dst, src), src) if self.arrivals else src
        out = self.exits.get((channel, dst, src), dst) if self.exits else dst
        s, d = self.nodes[into], self.nodes[out]
        conn = connection_id(self.comm, s, d, channel, CTS_QP) if self.comm else 0
        key = ecmp_key(s, d, channel)
        return self._append(new_flow(self._next(), s, d, size, deps, delay_ns, tag, key, conn, conn))

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
    ) -> int:
        """The clear-to-send of step `step` of a grouped p2p connection dst -> src (`clear_to_send`'s arguments):
        the receiving proxy posts the receives of one call's subs on a channel that share a receive comm (the same
        sending proxy: NCCL_NET_SHARED_COMMS) as one irecv of up to MAX_RECVS (net.cc `recvProxyProgress`: a group
        posts step s of all its subs at once, once each has room), so net_ib answers them with one CTS of
        `nreqs` x 64 B (`ncclIbPostFifo`). The first connection's step makes the CTS; the others' add their bytes
        and what frees their slot to it, up to MAX_RECVS receives a CTS. `step`: (the step, the connection's steps
        in flight): a group's subs share one depth (`maxDepth`), so connections of other windows do not group.
        `delay_ns`: as `clear_to_send`'s (the group's receive is posted once a turn, the first connection's delay).
        Returns its id."""
        key = (src, dst, channel, step)
        got = self.grouped.get(key)
        if got is None or got[1] >= MAX_RECVS:
            self.grouped[key] = (self.clear_to_send(src, dst, size, deps, tag, channel, delay_ns), 1)
            return self.grouped[key][0]
        fid, receives = got
        i = fid - self.first_id
        f = self.flows[i]
        self.flows[i] = replace(f, size=f.size + size, deps=tuple(dict.fromkeys((*f.deps, *deps))))
        self.grouped[key] = (fid, receives + 1)
        return fid

    def _network(self, s: int, d: int) -> bool:
        """Whether s -> d crosses hosts (NCCL's net transport, whose connections have IB queue pairs)."""
        hs, hd = self.host_of.get(s), self.host_of.get(d)
        return s != d and (hs is None or hd is None or hs != hd)

    def _message(
        self,
        s: int,
        d: int,
        size: int,
        deps: tuple[int, ...],
        delay_ns: int,
        tag: str,
        channel: int,
        qp: int,
        conn_key: int,
        ordered: bool = False,
        queue: int = 0,
    ) -> Flow:
        """A flow on queue pair `qp` of the connection (s, d, conn_key: the channel, or a relay's channel and
        sender); each queue pair its own ECMP key, from the channel."""
        conn, whole, key = self._conns.get((s, d, conn_key, qp, channel)) or self._connection(
            s, d, conn_key, qp, channel
        )
        # a connection's messages in turn on its queue pairs, or each split over all of them (each pair its part)
        if ordered and not queue:
            queue = conn if self.split_qps else whole
        fid = self.first_id + len(self.flows)
        return new_flow(fid, s, d, size, deps, delay_ns, self.prefix + tag, key, conn, queue)

    def _connection(self, s: int, d: int, conn_key: int, qp: int, channel: int) -> tuple[int, int, int]:
        """Queue pair `qp` of the connection (s, d, conn_key) on `channel`, kept: (its conn, its connection's qp 0's
        conn, its ECMP key)."""
        conn = connection_id(self.comm, s, d, conn_key, qp)
        whole = self.whole[conn] = connection_id(self.comm, s, d, conn_key) if qp else conn
        got = self._conns[s, d, conn_key, qp, channel] = (conn, whole, ecmp_key(s, d, channel) | (qp << 56))
        return got

    def add_helper(self, node: int, rank: int, host: object) -> int:
        """A position for a rank of the communicator outside the group that relays its flows (NCCL's PXN proxy of
        a grouped send/recv); return it. Its flows do not make that rank wait: it has no entry in `rank_last`."""
        self.nodes.append(node)
        self.ranks = (*self.ranks, rank)
        self.host_of[node] = host
        self.helpers += 1
        return len(self.nodes) - 1

    def join(self, pos: int, deps: tuple[int, ...], tag: str) -> int:
        """A zero-byte flow at position `pos` that ends once all `deps` have: one dependency for many; return its
        id."""
        node = self.nodes[pos]
        return self._append(Flow(self._next(), node, node, 0, deps, 0, self.prefix + tag))

    def _next(self) -> int:
        return self.first_id + len(self.flows)

    def _append(self, f: Flow) -> int:
        self.flows.append(f)
        return f.id

    def finish(self) -> FlowDag:
        """The DAG with `rank_last` computed.

        A rank's last flows are the flows it sends or receives that no other flow of the same rank
        depends on directly. Every other flow of the rank is an ancestor of one of them, so the rank
        is done exactly when all of them are.
        """
        members = len(self.nodes) - self.helpers
        last = rank_last(self.flows, self.nodes, self.ranks, members, self.first_id)
        return FlowDag(self.flows, last, self.first_id + len(self.flows))
