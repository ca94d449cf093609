"""NCCL 2.19 - 2.21's plan budget: where `ncclLaunchPrepare` ends a plan of a group's calls.

Read from enqueue.cc v2.19.4-1, v2.20.5-1 and v2.21.5-1. A plan (one kernel launch) may fill at most half of the
work FIFO, `NCCL_WORK_FIFO_DEPTH` (64 Ki slots of one 512-byte `ncclWork`, init.cc) / 2 = 32,768 works, counted as
the works its channels open. Each work gathers elements of one channel:

- collectives (`appendWorkElemColl`): up to 9 elements (NCCL_MAX_WORK_ELEMENTS) of one kernel (funcIndex) and warp
  count; another kernel, or a tenth element, opens a new work. A task is placed only while the budget is at least
  its channel count (`scheduleCollTasksToPlan`), else the plan ends.
- p2p (`appendWorkElemP2p`): up to 8 receives and 8 sends (NCCL_MAX_WORK_ELEMENTS_P2P = 16) with no two of one type
  to one peer; fusing is off for the operations of every 8th step of the rank's order (`fuseOk`), which open new
  works. An element is placed only while one work is left (`scheduleP2pTasksToPlan`), else the plan ends, and the
  next plan starts again at the order's step 0 with the chunks left.

MAXCHANNELS is 32 in these releases, so a call adds at most 32 works and a group of up to 1024 calls always fits one
plan; past that the works are counted here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from phantora.collectives.nccl.channel_split import div_up

WORK_FIFO_DEPTH = 64 << 10  # NCCL_WORK_FIFO_DEPTH's default (init.cc v2.19.4-1 .. v2.21.5-1), in works
BUDGET = WORK_FIFO_DEPTH // 2  # a non-persistent plan's works
MAX_CHANNELS = 32  # MAXCHANNELS (device.h): a task's elements, one a channel, are at most this many
ALWAYS_FITS = BUDGET // MAX_CHANNELS  # 1024 calls: every plan holds them whatever their channels
COLL_ELEMS = 9  # NCCL_MAX_WORK_ELEMENTS (device.h static_assert)
P2P_SLOTS = 16  # NCCL_MAX_WORK_ELEMENTS_P2P: receives in the even slots, sends in the odd
FUSE_STEPS = P2P_SLOTS // 2  # fuseOk is cleared at every 8th step of the order
BYTES_ALIGN = 16  # NCCL_BYTES_ALIGNMENT: maxBytesPerChannel's rounding
RECV, SEND = 0, 1


def coll_plans(tasks: Sequence[tuple[Hashable, int]], channels: int, budget: int = BUDGET) -> list[int]:
    """The tasks each plan of NCCL 2.20 - 2.21 holds for a group's collective `tasks` ((kernel, bytes) in plan order,
    none empty) on `channels` usable channels (tasks->usableChannels). Per plan the channels are filled by bytes
    (`addCBDCollToPlan`: each up to maxBytesPerChannel, the plan's remaining bytes over the channels rounded up to
    16; the tasks' count alignment is not restated), each task placed while the budget is at least its estimated
    channels, DIVUP(bytes x channels, the remaining bytes)."""
    out: list[int] = []
    start = 0
    nch = max(1, channels)
    while start < len(tasks):
        total = sum(b for _, b in tasks[start:])
        most = div_up(div_up(total, nch), BYTES_ALIGN) * BYTES_ALIGN
        filled = [0] * nch
        works = _CollWorks()
        left = budget
        held, lo = 0, 0  # lo: the first channel not full (channels fill in order)
        for kernel, nbytes in tasks[start:]:
            if held and left < div_up(nbytes * nch, max(1, total)):
                break
            rem = nbytes
            while lo < nch and filled[lo] >= most:
                lo += 1
            for c in range(lo, nch):
                if rem <= 0:
                    break
                put = min(most - filled[c], rem)
                left -= works.add(c, kernel)
                filled[c] += put
                rem -= put
            held += 1
        out.append(held)
        start += held
    return out


def coll_plans_least(tasks: Sequence[tuple[Hashable, int, int]], channels: int, budget: int = BUDGET) -> list[int]:
    """As `coll_plans` for NCCL 2.19, whose tasks ((kernel, bytes, their channels nBid) in plan order) each take
    their nBid least loaded channels (`addCollToPlan`), placed while the budget is at least nBid."""
    out: list[int] = []
    start = 0
    nch = max(1, channels)
    while start < len(tasks):
        load = [0] * nch
        works = _CollWorks()
        left = budget
        held = 0
        for kernel, nbytes, bids in tasks[start:]:
            nbid = max(1, min(bids, nch))
            if held and left < nbid:
                break
            for c in sorted(range(nch), key=lambda k: (load[k], k))[:nbid]:
                left -= works.add(c, kernel)
                load[c] += nbytes // nbid
            held += 1
        out.append(held)
        start += held
    return out


class _CollWorks:
    """Each channel's open collective work: its kernel and elements (`appendWorkElemColl`)."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[Hashable, int]] = {}

    def add(self, channel: int, kernel: Hashable) -> int:
        """Add an element of `kernel` on `channel`; 1 where it opens a work, else 0."""
        got = self.open.get(channel)
        if got is not None and got[0] == kernel and got[1] < COLL_ELEMS:
            self.open[channel] = (kernel, got[1] + 1)
            return 0
        self.open[channel] = (kernel, 1)
        return 1


@dataclass
class _P2pWork:
    """One channel's open p2p work: the peers of its receives and of its sends."""

    peers: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))

    def takes(self, side: int, peer: int) -> bool:
        """Whether an element of `side` to `peer` joins it (a free slot of its type, no element there to `peer`)."""
        mine = self.peers[side]
        return len(mine) < P2P_SLOTS // 2 and peer not in mine


def order(nodes: tuple[Hashable, ...], me: int) -> list[tuple[int, int]]:
    """Position `me`'s (send peer, receive peer) at each step of its p2p order (init.cc, v2.19.4-1 .. v2.21.5-1;
    -1 where a node has no rank at that step): node deltas 0, +d, -d, n/2 - d, -(n/2 - d) for d up to n/4, each
    over `steps` local steps (the most local ranks aligned to a power of 2 dividing 8, or up to a multiple of 8)."""
    members: dict[Hashable, list[int]] = {}
    for pos, node in enumerate(nodes):
        members.setdefault(node, []).append(pos)
    ranks = list(members.values())
    nn = len(ranks)
    node = next(k for k, m in enumerate(ranks) if me in m)
    local = ranks[node].index(me)
    most = max(len(m) for m in ranks)
    steps = -(-most // FUSE_STEPS) * FUSE_STEPS if most > FUSE_STEPS else FUSE_STEPS // (FUSE_STEPS // most)
    out: list[tuple[int, int]] = []
    for d in range(nn // 4 + 1):
        deltas = [d, (nn - d) % nn, nn // 2 - d, (nn - (nn // 2 - d)) % nn]
        keep = [0]
        for i, dup in ((1, (0,)), (2, (0,)), (3, (2, 1))):
            if all(deltas[i] != deltas[j] for j in dup):
                keep.append(i)
        for i in keep:
            to, frm = ranks[(node + deltas[i]) % nn], ranks[(node - deltas[i]) % nn]
            for s in range(steps):
                si, ri = (local + s) % steps, (local - s) % steps
                out.append((to[si] if si < len(to) else -1, frm[ri] if ri < len(frm) else -1))
    return out


def p2p_channel(nodes: tuple[Hashable, ...], me: int, peer: int, part: int, side: int, total: int) -> int:
    """The p2p channel of part `part` (chunk modulo the peer's channels) of `me`'s send (`side` SEND) to or receive
    from `peer` (channel.h `ncclChannelCompute`): a base from the peer's local step and node delta, mirrored over
    the `total` p2p channels (paths.cc `mirrorBits`), plus the part."""
    members: dict[Hashable, list[int]] = {}
    for pos, node in enumerate(nodes):
        members.setdefault(node, []).append(pos)
    ranks = list(members.values())
    nn = len(ranks)
    nsteps = max(len(m) for m in ranks)
    mine = next(k for k, m in enumerate(ranks) if me in m)
    theirs = next(k for k, m in enumerate(ranks) if peer in m)
    a, b = ranks[mine].index(me), ranks[theirs].index(peer)
    step = (b - a) % nsteps if side == SEND else (a - b) % nsteps
    delta = (theirs - mine) % nn if side == SEND else (mine - theirs) % nn
    base = delta + step // FUSE_STEPS if nn > 1 else step
    return (_mirror(base % total, total) + part) % total


def _mirror(val: int, pow2: int) -> int:
    """NCCL's mirrorBits: `val`'s bits reversed over log2(`pow2`) bits."""
    out, b, mb = 0, 1, pow2 >> 1
    while b < pow2:
        if val & b:
            out |= mb
        b, mb = b << 1, mb >> 1
    return out


def p2p_plans(
    nodes: tuple[Hashable, ...],
    me: int,
    queues: dict[tuple[int, int], int],
    calls: int,
    total: int,
    most: int,
    budget: int = BUDGET,
) -> list[int]:
    """The calls each plan of NCCL 2.19 - 2.21 holds for position `me`'s group of `calls` equal p2p calls:
    `queues` maps (side, peer) to the chunks of one call's operation to that peer (a send: SEND, a receive: RECV);
    `total` / `most`: the p2p channels and a peer's. A plan whose cut falls inside a call counts it too (the calls
    from its first element's to its last's)."""
    if calls * sum(queues.values()) <= budget:  # at most a work an element: one plan
        return [calls]
    steps = order(nodes, me)
    chans = {
        (side, peer): [p2p_channel(nodes, me, peer, k % max(1, most), side, total) for k in range(n)]
        for (side, peer), n in queues.items()
    }
    left_calls = {q: calls for q in queues}
    chunk = dict.fromkeys(queues, 0)
    out: list[int] = []
    while any(left_calls.values()):
        works: dict[int, _P2pWork] = {}
        room, fuse = budget, False
        first, last, full = -1, -1, False
        seen: tuple[object, int] | None = None  # the state and room at the last pass boundary
        while not full and any(left_calls.values()):
            low = min(left_calls.values())
            if low > 1:
                shape = tuple((n - low, chunk[q]) for q, n in left_calls.items())
                state = (tuple(sorted((c, tuple(map(tuple, w.peers))) for c, w in works.items())), fuse, shape)
                if seen is not None and seen[0] == state and seen[1] > room:
                    # passes repeat from here, each opening the same works: skip those that end 2 passes short of the
                    # budget (their state is this one), the last ones run element by element
                    each = seen[1] - room
                    skip = min(max(0, room // each - 2), low - 1)
                    for q in left_calls:
                        left_calls[q] -= skip
                    room -= skip * each
                    last += skip
                seen = (state, room)
            for i, (to, frm) in enumerate(steps):
                ends = [(RECV, frm), (SEND, to)]
                live = [q for q in ends if q in queues and left_calls[q]]
                if not live:
                    continue
                while live and not full:
                    if i % FUSE_STEPS == 0:
                        fuse = False
                    for q in live:
                        if room < 1:
                            full = True
                            break
                        side, peer = q
                        call = calls - left_calls[q]
                        c = chans[q][chunk[q]]
                        got = works.get(c)
                        if not (fuse and got is not None and got.takes(side, peer)):
                            got = works[c] = _P2pWork()
                            room -= 1
                        got.peers[side].append(peer)
                        fuse = True
                        first = call if first < 0 else min(first, call)
                        last = max(last, call)
                        chunk[q] += 1
                        if chunk[q] == queues[q]:
                            chunk[q], left_calls[q] = 0, left_calls[q] - 1
                    live = [q for q in live if left_calls[q] and chunk[q]]
                if full:
                    break
        out.append(last - first + 1)
    return out


def nccl_tests_p2p_plans(
    kind: str, nodes: tuple[Hashable, ...], calls: int, parts: int, self_parts: int, total: int, most: int
) -> list[int]:
    """`p2p_plans` of position 0 in a group of `calls` equal all-to-alls (a send and a receive with every rank,
    itself too, of `parts` chunks each, `self_parts` to itself) or nccl-tests' sendrecv ring (a send to position 1,
    a receive from the last); [calls] where one plan holds them."""
    if calls <= ALWAYS_FITS:
        return [calls]
    n = len(nodes)
    if kind == "all_to_all":
        queues = {(side, q): (self_parts if q == 0 else parts) for q in range(n) for side in (RECV, SEND)}
    else:
        queues = {(SEND, 1 % n): parts, (RECV, n - 1): parts}
    return p2p_plans(nodes, 0, {q: max(1, c) for q, c in queues.items()}, calls, total, most)


def coll_group_plans(
    version: tuple[int, int], sizes: Sequence[int], kernels: Sequence[Hashable], nranks: int, channels: int
) -> list[int]:
    """The calls each NCCL 2.19 - 2.21 plan holds of a group of collective calls of `sizes` bytes (in plan order,
    each of kernel `kernels[i]`) on `channels` usable channels; [len(sizes)] up to ALWAYS_FITS calls. 2.19 takes
    each call's channels as its aggregate's bytes per channel, NCCL_AGG_CHANNEL_SIZE x min(16, nranks) halved while
    the group's bytes would not fill the channels (coll_group.pipe_ops)."""
    if len(sizes) <= ALWAYS_FITS:
        return [len(sizes)]
    live = [(k, s) for k, s in zip(kernels, sizes, strict=True) if s > 0]
    if version >= (2, 20):
        return coll_plans(live, channels)
    from phantora.collectives.nccl.coll_group import agg_channel_size

    per = agg_channel_size(nranks, channels, sum(sizes))
    return coll_plans_least([(k, s, div_up(s, per)) for k, s in live], channels)
