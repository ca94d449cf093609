"""NCCL 2.22+'s plan budget for a group's p2p operations: where `scheduleP2pTasksToPlan` ends a plan.

Read from enqueue.cc v2.22.3-1 .. v2.30.7-1. A plan is one kernel launch; its work batches (16 B each) go in the
kernel's 4 KiB arguments past their 32 B header, its works (`ncclDevWorkP2p`, 48 B) there too or in half the work
FIFO (`ncclTestBudget`). Before each operation (a round's send and receive) the planner checks room for one new
batch on each of the peer's most channels (`nChannelsMax`, p2pnChannelsPerPeer) and one more work, or the plan ends
and the next one starts at that operation's round (v2.29.7-1 on, `*p2pRound`) or at round 0 (before: rounds already
taken in the cut pass take their next operations first; `plan_queues`). `addP2pToPlan` adds the operation's work to
a batch on each channel of its parts (`addWorkBatchToPlan`): a new batch where the channel's batch already holds a
work of the same round (the next pass over one peer's queue), 8 works (NCCL_MAX_DEV_WORK_P2P_PER_BATCH) or 1 KiB of
them; an extension batch (counted too) past 64 works from the batch's first. From v2.28.7-1 also where the
channel's batch holds a round of another group of 8 (`p2pRound / NCCL_MAX_DEV_WORK_P2P_PER_BATCH`), from v2.29.2-1
where its pass differs (`p2pEpoch`, one a sweep over the rounds; NCCL_P2P_EPOCH_ENABLE, default 1, 0 turns it off):
`BatchRules`. So a plan holds fewer operations as they span more channels: sendrecv_perf calls on 8 H100s
(32 channels a peer at most) 223 to a plan at 8 B (one channel), 56 at 256 KiB (4), 14 at 256 MiB (16).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from phantora.collectives.nccl.coll_group import ARGS_BYTES, ARGS_HEADER, BATCH_BYTES, FIFO_BYTES, MAX_BATCH_BYTES
from phantora.collectives.nccl.p2p_schedule import LATEST, P2P_PER_BATCH, Version, send_rounds, transfer_channel_ids

PLANS_FROM = (2, 22)  # v2.22.3-1: addWorkBatchToPlan / ncclTestBudget for p2p works (2.19 - 2.21: not restated)
WORK_BYTES = 48  # sizeof(ncclDevWorkP2p), alignas(16), v2.22.3-1 .. v2.30.7-1
PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH
EXTEND_PAST = 63  # an extension batch past 63 work sizes from the batch's base
RESUME_FROM = (2, 29, 7)  # v2.29.7-1: the next plan starts at the round where the last ended (`*p2pRound`)
GROUPS_FROM = (2, 28, 7)  # v2.28.7-1: a batch holds rounds of one group of PER_BATCH
EPOCHS_FROM = (2, 29, 2)  # v2.29.2-1: a batch holds works of one pass (`p2pEpoch`, NCCL_P2P_EPOCH_ENABLE)

Op = tuple[int, tuple[int, ...]]  # (round, channels of its parts)
Pair = tuple[int, int]  # (sender, receiver) positions in the communicator


def _fits(batches: int, works: int) -> bool:
    """`ncclTestBudget` for a non-persistent plan: batches and works in the kernel's arguments, or the batches there
    and the works in half the work FIFO."""
    in_args = ARGS_BYTES - ARGS_HEADER
    batch = batches * BATCH_BYTES
    return batch + works <= in_args or (batch <= in_args and works <= FIFO_BYTES // 2)


def _since(release: tuple[int, ...], tag: tuple[int, int, int]) -> bool:
    """Whether NCCL `release` ((major, minor) or a patch 0: that minor's newest) is `tag` or later."""
    if release[:2] != tag[:2]:
        return release[:2] > tag[:2]
    return len(release) < 3 or release[2] == 0 or release[2] >= tag[2]


@dataclass(frozen=True)
class BatchRules:
    """Which of `addWorkBatchToPlan`'s newer reasons for a new p2p batch the release has (2.22 - 2.28.3: neither)."""

    groups: bool = False  # v2.28.7-1: no two rounds of different groups of 8 in a batch
    epochs: bool = False  # v2.29.2-1 with NCCL_P2P_EPOCH_ENABLE != 0: no two passes in a batch


def batch_rules(release: tuple[int, ...], epoch_enable: bool = True) -> BatchRules:
    """The batch rules of NCCL `release`; `epoch_enable`: NCCL_P2P_EPOCH_ENABLE != 0 (read from v2.29.2-1 only)."""
    return BatchRules(_since(release, GROUPS_FROM), epoch_enable and _since(release, EPOCHS_FROM))


class _Plan:
    """One plan's budget so far: its operations, batches, works' bytes and each channel's open batch."""

    def __init__(self, rules: BatchRules = BatchRules()) -> None:
        self.held = self.batches = self.works = 0
        self.rules = rules
        # channel -> (its batch's base offset, bytes, rounds, pass)
        self.wip: dict[int, tuple[int, int, list[int], int]] = {}

    def _new_batch(self, got: tuple[int, int, list[int], int] | None, rnd: int, epoch: int) -> bool:
        """`addWorkBatchToPlan`'s reasons for a new batch on a channel whose open batch is `got`."""
        if got is None:
            return True
        _, nbytes, rounds, was = got
        if len(rounds) == PER_BATCH or nbytes + WORK_BYTES > MAX_BATCH_BYTES or rnd in rounds:
            return True
        if self.rules.epochs and was != epoch:
            return True
        return self.rules.groups and rounds[0] // PER_BATCH != rnd // PER_BATCH  # a batch's rounds share a group

    def room(self, most: int) -> bool:
        """Whether the plan takes one more operation: any first, else one new batch on each of `most` channels and
        one more work within `ncclTestBudget`."""
        return not self.held or _fits(self.batches + most, self.works + WORK_BYTES)

    def add(self, rnd: int, channels: tuple[int, ...], epoch: int = 0) -> None:
        """Add round `rnd`'s operation of pass `epoch`, a work on each of `channels` (`addWorkBatchToPlan`)."""
        for c in channels:
            got = self.wip.get(c)
            if got is None or self._new_batch(got, rnd, epoch):
                self.wip[c] = (self.works, WORK_BYTES, [rnd], epoch)
                self.batches += 1
                continue
            base, nbytes, rounds, _ = got
            if self.works - base > EXTEND_PAST * WORK_BYTES:  # an extension: counted, fused with its batch on device
                base = self.works
                self.batches += 1
            self.wip[c] = (base, nbytes + WORK_BYTES, [*rounds, rnd], epoch)
        self.works += WORK_BYTES
        self.held += 1


def plan_ops(ops: Sequence[Op], most: int, rules: BatchRules = BatchRules()) -> list[int]:
    """How many of one rank's p2p operations (`ops`, in the planner's order: pass by pass, round by round, so a
    round no later than the one before starts a pass) each plan holds; `most`: the peer's most channels
    (nChannelsMax); `rules`: the release's batch rules. Every NCCL 2.22+ takes a group whose rounds all hold as many
    operations so (`plan_queues` for the others)."""
    out: list[int] = []
    plan = _Plan(rules)
    epoch, last = 0, -1
    for rnd, channels in ops:
        if rnd <= last:
            epoch += 1
        last = rnd
        if not plan.room(most):
            out.append(plan.held)
            plan = _Plan(rules)
        plan.add(rnd, channels, epoch)
    if plan.held:
        out.append(plan.held)
    return out


def resumes(release: tuple[int, ...]) -> bool:
    """Whether NCCL `release` ((major, minor) or a patch 0: that minor's newest) starts a plan at the round where
    the one before ended (`*p2pRound`, v2.29.7-1 on) rather than at round 0 (v2.22.3-1 .. v2.29.3-1)."""
    return _since(release, RESUME_FROM)


def plan_queues(
    queues: Sequence[Sequence[tuple[int, ...]]], most: int, resume: bool, rules: BatchRules = BatchRules()
) -> list[list[int]]:
    """The plan (0 first) of each operation of each round's queue (`queues[r]`: round r's operations in turn, each
    the channels of its parts), as one rank's `scheduleP2pTasksToPlan` takes them: sweep after sweep over the rounds,
    each round's next operation. A plan ends where `_Plan.room` fails; the next starts at that round (`resume`) or
    at round 0, where rounds already taken in the cut sweep take their next operations first. Each sweep is a pass
    (`p2pEpoch`, which `rules.epochs` keeps out of one batch)."""
    out = [[-1] * len(q) for q in queues]
    heads = [0] * len(queues)
    left = sum(len(q) for q in queues)
    plan, index, start, epoch = _Plan(rules), 0, 0, 0
    while left:
        for rnd in range(start, len(queues)):
            if heads[rnd] == len(queues[rnd]):
                continue
            if not plan.room(most):
                plan, index = _Plan(rules), index + 1
                start = rnd if resume else 0
                epoch += 0 if resume else 1  # 2.29.2 - 2.29.3: a new pass each call (a new plan's batches anyway)
                break
            plan.add(rnd, queues[rnd][heads[rnd]], epoch)
            out[rnd][heads[rnd]] = index
            heads[rnd] += 1
            left -= 1
        else:
            start, epoch = 0, epoch + 1
    return out


def calls_per_plan(
    kind: str,
    nodes: tuple[int, ...],
    calls: int,
    parts: int,
    self_parts: int,
    total: int,
    most: int,
    rules: BatchRules = BatchRules(),
    v: Version = LATEST,
    group: int = P2P_PER_BATCH,
) -> list[int]:
    """The calls (operations to one peer) each plan of an NCCL group of `calls` equal p2p calls holds, as position 0
    of a communicator whose position i lives on node `nodes[i]` plans them: all-to-all (alltoall_perf: a send and a
    receive with every rank, itself too) or nccl-tests' sendrecv ring (a send to position 1, a receive from the
    last). `parts` / `self_parts`: the channels of an operation to a peer / to itself; `total`: the p2p channels;
    `most`: a peer's most; `rules`: the release's batch rules; `v`: the release, whose round schedule
    (`p2p_schedule.p2p_form`; `group`: NCCL_P2P_SCHEDULE_GROUP_SIZE) orders the peers. A plan cut inside a pass
    counts the pass in both plans (its peers' longest queue)."""
    n = len(nodes)
    rounds = send_rounds(nodes, 0, v, group)
    if kind == "all_to_all":
        wanted = list(range(len(rounds)))
        dst = dict(enumerate(rounds))
    else:
        recv_round = next(k for k, peer in enumerate(send_rounds(nodes, n - 1, v, group)) if peer == 0)
        send_round = rounds.index(1 % n)
        wanted = sorted({send_round, recv_round})
        dst = {send_round: 1 % n, recv_round: rounds[recv_round]}
    one_pass: list[Op] = []
    for k in wanted:
        peer = dst[k]
        if peer == 0:
            one_pass.append((k, tuple(transfer_channel_ids(nodes, 0, 0, self_parts, total, v, group))))
        else:
            one_pass.append((k, tuple(transfer_channel_ids(nodes, 0, peer, parts, total, v, group))))
    cut = plan_ops(one_pass * calls, most, rules)
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
    nodes: tuple[Hashable, ...],
    channels: Mapping[Pair, Sequence[tuple[int, ...]]],
    most: int,
    resume: bool = True,
    rules: BatchRules = BatchRules(),
    v: Version = LATEST,
    group: int = P2P_PER_BATCH,
) -> dict[Pair, tuple[int, ...]]:
    """The plan (0 first) each operation of each pair runs in, each rank planning its own (a live group: a
    batch_isend_irecv, a coalescing block). `channels`: each (sender, receiver) position pair's operations in turn,
    each the p2p channel ids of its parts, on a communicator whose position i lives on node `nodes[i]`; `most`: a
    peer's most channels; `resume`: NCCL's plans resume at the cut round (`resumes`); `rules`: its batch rules;
    `v`: the release, whose round schedule orders each rank's operations (`p2p_schedule.p2p_form`; `group`:
    NCCL_P2P_SCHEDULE_GROUP_SIZE). On
    each rank a round's k-th operation is its send's and its receive's k-th, one operation on both their channels,
    planned by `plan_queues`; an operation runs in the later of its sender's plan and its receiver's (each end's
    kernel moves it)."""
    ranks = sorted({r for pair in channels for r in pair})
    plan: dict[tuple[Pair, int, int], int] = {}  # (pair, k, 0 at the sender / 1 at the receiver) -> plan
    for me in ranks:
        ends, got = _rank_cut(nodes, me, channels, most, resume, rules, v, group)
        for (send, recv), at in zip(ends, got, strict=True):
            for side, pair in enumerate((send, recv)):
                for k in range(len(channels.get(pair, ()))):
                    plan[(pair, k, side)] = at[k]
    return {
        pair: tuple(max(plan[(pair, k, 0)], plan[(pair, k, 1)]) for k in range(len(o))) for pair, o in channels.items()
    }


def _rank_cut(
    nodes: tuple[Hashable, ...],
    me: int,
    channels: Mapping[Pair, Sequence[tuple[int, ...]]],
    most: int,
    resume: bool,
    rules: BatchRules,
    v: Version,
    group: int,
) -> tuple[list[tuple[Pair, Pair]], list[list[int]]]:
    """Position `me`'s rounds, each its (send pair, receive pair), and the plan of each of its rounds' operations
    (`plan_queues`): a round's k-th operation is its send's and its receive's k-th, on both their channels."""
    sends = send_rounds(nodes, me, v, group)
    recv_of = {}  # round -> the peer `me` receives from in it
    for q in range(len(nodes)):
        for rnd, peer in enumerate(send_rounds(nodes, q, v, group)):
            if peer == me:
                recv_of[rnd] = q
    ends = [((me, to), (recv_of[rnd], me)) for rnd, to in enumerate(sends)]
    queues = []
    for send, recv in ends:
        ops = [channels.get(send, ()), channels.get(recv, ())]
        queues.append([tuple(sorted({c for o in ops if len(o) > k for c in o[k]})) for k in range(max(map(len, ops)))])
    return ends, plan_queues(queues, most, resume, rules)


def rank_plans(
    nodes: tuple[Hashable, ...],
    me: int,
    channels: Mapping[Pair, Sequence[tuple[int, ...]]],
    most: int,
    resume: bool = True,
    rules: BatchRules = BatchRules(),
    v: Version = LATEST,
    group: int = P2P_PER_BATCH,
) -> int:
    """The plans (kernel launches) position `me` cuts its own operations of a live group into (`channels`: as
    `pair_plans`', its pairs only needed; `v`: the release; `group`: NCCL_P2P_SCHEDULE_GROUP_SIZE): its host
    launches each at ncclGroupEnd."""
    _, got = _rank_cut(nodes, me, channels, most, resume, rules, v, group)
    return 1 + max((i for at in got for i in at), default=0)
