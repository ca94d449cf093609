"""NCCL 2.22+'s plan budget for a group's p2p operations: where `scheduleP2pTasksToPlan` ends a plan.

Read from enqueue.cc v2.22.3-1 .. v2.30.7-1. A plan is one kernel launch; its work batches (16 B each) go in the
kernel's 4 KiB arguments past their 32 B header, its works (`ncclDevWorkP2p`, 48 B) there too or in half the work
FIFO (`ncclTestBudget`). Before each operation (a round's send and receive) the planner checks room for one new
batch on each of the peer's most channels (`nChannelsMax`, p2pnChannelsPerPeer) and one more work, or the plan ends
and the next one starts with that operation. `addP2pToPlan` adds the operation's work to a batch on each channel of
its parts (`addWorkBatchToPlan`): a new batch where the channel's batch already holds a work of the same round (the
next pass over one peer's queue), 8 works (NCCL_MAX_DEV_WORK_P2P_PER_BATCH) or 1 KiB of them; an extension batch
(counted too) past 64 works from the batch's first. So a plan holds fewer operations as they span more channels:
sendrecv_perf calls on 8 H100s (32 channels a peer at most) 223 to a plan at 8 B (one channel), 56 at 256 KiB (4),
14 at 256 MiB (16).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from phantora.collectives.nccl.coll_group import ARGS_BYTES, ARGS_HEADER, BATCH_BYTES, FIFO_BYTES, MAX_BATCH_BYTES
from phantora.collectives.nccl.p2p_schedule import send_rounds, transfer_channel_ids

PLANS_FROM = (2, 22)  # v2.22.3-1: addWorkBatchToPlan / ncclTestBudget for p2p works (2.19 - 2.21: not restated)
WORK_BYTES = 48  # sizeof(ncclDevWorkP2p), alignas(16), v2.22.3-1 .. v2.30.7-1
PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH
EXTEND_PAST = 63  # an extension batch past 63 work sizes from the batch's base

Op = tuple[int, tuple[int, ...]]  # (round, channels of its parts)
Pair = tuple[int, int]  # (sender, receiver) positions in the communicator


def _fits(batches: int, works: int) -> bool:
    """`ncclTestBudget` for a non-persistent plan: batches and works in the kernel's arguments, or the batches there
    and the works in half the work FIFO."""
    in_args = ARGS_BYTES - ARGS_HEADER
    batch = batches * BATCH_BYTES
    return batch + works <= in_args or (batch <= in_args and works <= FIFO_BYTES // 2)


def plan_ops(ops: Sequence[Op], most: int) -> list[int]:
    """How many of one rank's p2p operations (`ops`, in the planner's order: pass by pass, round by round) each plan
    holds; `most`: the peer's most channels (nChannelsMax)."""
    out: list[int] = []
    held = batches = works = 0
    wip: dict[int, tuple[int, int, list[int]]] = {}  # channel -> (its batch's base offset, works' bytes, rounds)
    for rnd, channels in ops:
        if held and not _fits(batches + most, works + WORK_BYTES):
            out.append(held)
            held = batches = works = 0
            wip = {}
        for c in channels:
            got = wip.get(c)
            new = got is None or len(got[2]) == PER_BATCH or got[1] + WORK_BYTES > MAX_BATCH_BYTES or rnd in got[2]
            if new:
                wip[c] = (works, WORK_BYTES, [rnd])
                batches += 1
                continue
            assert got is not None
            base, nbytes, rounds = got
            if works - base > EXTEND_PAST * WORK_BYTES:  # an extension: counted, fused with its batch on the device
                base = works
                batches += 1
            wip[c] = (base, nbytes + WORK_BYTES, [*rounds, rnd])
        works += WORK_BYTES
        held += 1
    if held:
        out.append(held)
    return out


def calls_per_plan(
    kind: str, nodes: tuple[int, ...], calls: int, parts: int, self_parts: int, total: int, most: int
) -> list[int]:
    """The calls (operations to one peer) each plan of an NCCL group of `calls` equal p2p calls holds, as position 0
    of a communicator whose position i lives on node `nodes[i]` plans them: all-to-all (alltoall_perf: a send and a
    receive with every rank, itself too) or nccl-tests' sendrecv ring (a send to position 1, a receive from the
    last). `parts` / `self_parts`: the channels of an operation to a peer / to itself; `total`: the p2p channels;
    `most`: a peer's most. A plan cut inside a pass counts the pass in both plans (its peers' longest queue)."""
    n = len(nodes)
    rounds = send_rounds(nodes, 0)
    if kind == "all_to_all":
        wanted = list(range(len(rounds)))
        dst = dict(enumerate(rounds))
    else:
        recv_round = next(k for k, peer in enumerate(send_rounds(nodes, n - 1)) if peer == 0)
        send_round = rounds.index(1 % n)
        wanted = sorted({send_round, recv_round})
        dst = {send_round: 1 % n, recv_round: rounds[recv_round]}
    one_pass: list[Op] = []
    for k in wanted:
        peer = dst[k]
        if peer == 0:
            one_pass.append((k, tuple(transfer_channel_ids(nodes, 0, 0, self_parts, total))))
        else:
            one_pass.append((k, tuple(transfer_channel_ids(nodes, 0, peer, parts, total))))
    cut = plan_ops(one_pass * calls, most)
    out: list[int] = []
    start = 0
    width = len(one_pass)
    for held in cut:
        first, last = start // width, (start + held - 1) // width
        out.append(last - first + 1)
        start += held
    return out


def _expand(cut: list[int]) -> list[int]:
    """The plan index of each operation, from the operations each plan holds."""
    return [i for i, held in enumerate(cut) for _ in range(held)]


def pair_plans(
    nodes: tuple[Hashable, ...], channels: Mapping[Pair, Sequence[tuple[int, ...]]], most: int
) -> dict[Pair, tuple[int, ...]]:
    """The plan (0 first) each operation of each pair runs in, each rank planning its own (a live group: a
    batch_isend_irecv, a coalescing block). `channels`: each (sender, receiver) position pair's operations in turn,
    each the p2p channel ids of its parts, on a communicator whose position i lives on node `nodes[i]`; `most`: a
    peer's most channels. On each rank NCCL plans pass by pass (the head of each peer's queues), round by round, a
    round's send and receive one operation on both their channels, and cuts by `plan_ops`; an operation runs in the
    later of its sender's plan and its receiver's (each end's kernel moves it)."""
    ranks = sorted({r for pair in channels for r in pair})
    sends = {r: send_rounds(nodes, r) for r in range(len(nodes))}
    recv_of: dict[int, dict[int, int]] = {r: {} for r in ranks}  # rank -> round -> the peer it receives from
    for q, peers in sends.items():
        for rnd, peer in enumerate(peers):
            if peer in recv_of:
                recv_of[peer][rnd] = q
    plan: dict[tuple[Pair, int, int], int] = {}  # (pair, k, 0 at the sender / 1 at the receiver) -> plan
    for me in ranks:
        passes = max(len(o) for pair, o in channels.items() if me in pair)
        order: list[tuple[Pair, int, int]] = []
        ops: list[Op] = []
        for k in range(passes):
            for rnd, to in enumerate(sends[me]):
                send, recv = (me, to), (recv_of[me][rnd], me)
                here = [(p, side) for p, side in ((send, 0), (recv, 1)) if len(channels.get(p, ())) > k]
                if not here:
                    continue
                used = sorted({c for p, _ in here for c in channels[p][k]})
                ops.append((rnd, tuple(used)))
                order.extend((p, k, side) for p, side in here)
                order.append(((-1, -1), -1, -1))  # the end of one operation
        index = _expand(plan_ops(ops, most))
        op = 0
        for key in order:
            if key[1] < 0:
                op += 1
            else:
                plan[key] = index[op]
    return {
        pair: tuple(max(plan[(pair, k, 0)], plan[(pair, k, 1)]) for k in range(len(o))) for pair, o in channels.items()
    }
