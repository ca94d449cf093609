"""Several collectives in one NCCL group (ncclGroupStart ... ncclGroupEnd): how NCCL schedules them into one launch.

Read from enqueue.cc, v2.19.4-1 to v2.30.7-1. A group's collective tasks of one (function, reduction, type) are
aggregated and NCCL's tuner picks one algorithm and protocol for each aggregate, on its summed count, then every task
of it runs with that choice, each on its own channels, all in one plan (one kernel launch):

- v2.19 (`scheduleCollTasksToPlan`): consecutive tasks of one (function, reduction, type) in issue order form an
  aggregate. The tuner rates it with `numPipeOps` = opPerChannel: each task after the first asks
  DIVUP(bytes, bytePerChannel) channels (bytePerChannel: NCCL_AGG_CHANNEL_SIZE, 2 MiB, x min(16, nranks), halved
  while the group's bytes would not fill every channel, down to NCCL_MIN_CHANNEL_SIZE, 512 B); opPerChannel is
  those channels over min(nChannels, them). Each task then runs on its DIVUP(bytes, bytePerChannel) least loaded
  channels.
- v2.20 - v2.21: consecutive tasks of one (function, reduction, type) aggregate, rated with numPipeOps 1; the
  channels are dealt by bytes (addCBDCollToPlan).
- v2.22.3-1 on (`ncclPrepareTasks`): tasks sorted by traffic, binned by (function, reduction, type), each bin
  ascending; a run of tasks under 4 x the traffic of its first aggregates. numPipeOps is
  DIVUP(nTasksColl, comm->nChannels), the group's calls, for every aggregate. `scheduleCollTasksToPlan` deals every
  task's traffic onto the channels in turn (`deal`, `deal_plan` for several aggregates: those not NVLS first, then
  the NVLS ones from channel 0): each channel is given the plan's traffic over its channels, a task starts where the
  one before it left off, so small tasks share a channel (run one after another on it) and a large one spans
  several.

The tuner's time for an aggregate is lat x latCount + bytes / bw (`ncclTopoGetAlgoTime`): latCount is numPipeOps
for a ring, DIVUP(numPipeOps, works a batch holds) for the others: NCCL_MAX_WORK_ELEMENTS, 9, before 2.22;
NCCL_MAX_DEV_WORK_BATCH_COLLS = 1024 / sizeof(ncclDevWorkColl) from 2.22 (16 for 2.22's 64-byte work, 10 for
2.23 - 2.29's 96 bytes, 7 for 2.30's padded 144 bytes).

From 2.22 a group may take several plans, launched one after another (`plans`): each plan guesses it holds the tasks
whose batches, at 4 works each, fit the kernel's 4 KiB arguments (1017 tasks), then ends before a task that could
take its batches past 254. 2.19 - 2.21 run a group as one launch while it fits half the work FIFO
(fifo_budget.py: always up to 1024 calls).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from phantora.collectives.nccl.channel_split import (
    BUDGET_ROUNDED_FROM,
    CELL_TRAFFIC_FROM,
    LL_TRAFFIC_X4_FROM,
    SPLIT_FROM,
    _min_traffic,
    div_up,
    traffic_per_byte,
)

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")  # NCCL's collective tasks
SORTED_FROM = (2, 22)  # v2.22.3-1: ncclPrepareTasks sorts, bins and aggregates within 4x
PIPE_ONE_FROM = (2, 20)  # v2.20.3-1: an aggregate is rated with numPipeOps 1
AGG_CHANNEL_SIZE = 2 << 20  # NCCL_AGG_CHANNEL_SIZE, v2.19
MIN_CHANNEL_SIZE = 8 * 64  # NCCL_MIN_CHANNEL_SIZE: NCCL_LL_THREAD_THRESHOLD x 64, v2.19
ARGS_BYTES = 4 << 10  # ncclMaxKernelArgsSize, v2.22.3-1 .. v2.30.7-1 (NCCL_WORK_ARGS_BYTES only lowers it)
ARGS_HEADER = 32  # sizeof(ncclDevKernelArgs): the work batches follow it in the kernel's arguments
BATCH_BYTES = 16  # sizeof(ncclDevWorkBatch)
FIFO_BYTES = 1 << 20  # NCCL_WORK_FIFO_BYTES' default: a non-persistent plan's works fill at most half of it
MAX_BATCH_BYTES = 1024  # NCCL_MAX_DEV_WORK_BATCH_BYTES: the works one batch (with its extensions) holds
EXTEND_PAST = 63  # a batch's works lie within 64 work sizes of its base (its offset bitset); past that, an extension


def batch_colls(version: tuple[int, int]) -> int:
    """The works one batch holds, which divide numPipeOps in a non-ring latency (see the module's notes)."""
    if version < SPLIT_FROM:
        return 9
    if version < (2, 23):
        return 16
    return 10 if version < (2, 30) else 7


def work_bytes(version: tuple[int, int]) -> int:
    """sizeof(ncclDevWorkColl) from 2.22: 64 bytes, 96 from 2.23, 144 (padded) from 2.30."""
    return {16: 64, 10: 96, 7: 144}[batch_colls(version)]


def aggregates(version: tuple[int, int], calls: Sequence[tuple[str, str, str, int]]) -> list[list[int]]:
    """The aggregates of a group's collective calls, (kind, reduction, dtype, bytes) in issue order: each a list of
    the calls' indices, in the order NCCL puts them in its plan."""
    if version < SORTED_FROM:
        out: list[list[int]] = []
        for i, c in enumerate(calls):
            if out and calls[out[-1][0]][:3] == c[:3]:
                out[-1].append(i)
            else:
                out.append([i])
        return out
    # the sorter hands the tasks out largest first; each (fn, op, ty) bin is then a LIFO: smallest first
    order = sorted(range(len(calls)), key=lambda i: -calls[i][3])
    bins: dict[tuple[str, str, str], list[int]] = {}
    for i in order:
        bins.setdefault(calls[i][:3], []).insert(0, i)
    out = []
    for members in bins.values():
        k = 0
        while k < len(members):
            first = _traffic(calls[members[k]])
            end = k + 1
            while end < len(members) and _traffic(calls[members[end]]) < 4 * first:
                end += 1
            out.append(members[k:end])
            k = end
    return out


def _traffic(call: tuple[str, str, str, int]) -> int:
    """A call's traffic as the 2.22+ sorter compares it (its bytes x the function's traffic per byte; the group's
    ranks are the same for all, so they scale every call alike and drop out: nranks 2 stands for them)."""
    return call[3] * traffic_per_byte(call[0], 2)


def pipe_ops(
    version: tuple[int, int],
    sizes: Sequence[int],
    ntasks: int,
    nranks: int,
    channels: int,
    group_bytes: int | None = None,
) -> int:
    """numPipeOps of an aggregate of calls of `sizes` bytes (in issue order) in a group of `ntasks` collective
    calls on a communicator of `nranks` ranks and `channels` channels (comm->nChannels). From 2.22 every aggregate
    of the group, one call's too, takes DIVUP(the group's calls, channels) (ncclPrepareTasks' nTasksPerChannel);
    2.20 - 2.21 take 1; 2.19 counts an aggregate's own calls' channels, halving NCCL_AGG_CHANNEL_SIZE while the
    group's bytes (`group_bytes`, default the aggregate's) would not fill the channels."""
    if version >= SORTED_FROM:
        return div_up(max(1, ntasks), max(1, channels))
    if len(sizes) < 2 or version >= PIPE_ONE_FROM:
        return 1
    per = agg_channel_size(nranks, channels, sum(sizes) if group_bytes is None else group_bytes)
    asked = sum(max(1, min(div_up(s, per), channels)) for s in sizes[1:])  # the head's own are not counted
    return div_up(asked, max(1, min(channels, asked)))


def agg_channel_size(nranks: int, channels: int, total: int) -> int:
    """v2.19's bytes a channel of an aggregate's call: NCCL_AGG_CHANNEL_SIZE x min(16, nranks), halved while the
    group's `total` bytes (tasks->collBytesTotal) would not fill the `channels`, down to NCCL_MIN_CHANNEL_SIZE."""
    per = AGG_CHANNEL_SIZE * min(16, nranks)
    while total < per * channels and per > MIN_CHANNEL_SIZE:
        per //= 2
    return per


def lat_count(version: tuple[int, int], algorithm: str, pipe: int) -> int:
    """ncclTopoGetAlgoTime's latCount: numPipeOps for a ring, else numPipeOps over the works a batch holds."""
    return pipe if algorithm == "ring" else div_up(pipe, batch_colls(version))


def deal(
    version: tuple[int, int],
    kind: str,
    proto: str,
    nranks: int,
    counts: Sequence[int],
    task_channels: int,
    max_channels: int,
) -> list[tuple[int, tuple[int, ...]]] | None:
    """Each task's (first channel, bytes of its count on each of its channels) as NCCL 2.22+'s
    `scheduleCollTasksToPlan` deals one aggregate's tasks (`counts`: each task's count in bytes, in plan order;
    `task_channels`: the aggregate's nMaxChannels; `max_channels`: the communicator's channels of its kind). None
    before 2.22 (each task strides its channels: the caller splits the sum)."""
    return deal_plan(version, nranks, [(kind, proto, c, task_channels) for c in counts], max_channels)


def deal_plan(
    version: tuple[int, int],
    nranks: int,
    tasks: Sequence[tuple[str, str, int, int]],
    max_channels: int,
) -> list[tuple[int, tuple[int, ...]]] | None:
    """`deal` over a plan's tasks of one scheduling kind (not NVLS, not CollNet), several aggregates' one after
    another: `tasks` are (function, protocol, count in bytes, its aggregate's nMaxChannels) in plan order. Each
    channel is given the tasks' summed traffic over min(their nMaxChannels summed, `max_channels`) and the channel
    cursor runs on from one aggregate to the next; each task's traffic is its function's per byte, 4 x for LL from
    2.26. None before 2.22."""
    if version < SPLIT_FROM:
        return None
    return list(_placements(version, nranks, tasks, max_channels))


def _placements(
    version: tuple[int, int],
    nranks: int,
    tasks: Sequence[tuple[str, str, int, int]],
    max_channels: int,
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Each of `tasks`' (first channel, parts) in turn, as `deal_plan` deals them (2.22+): NCCL may end its plan
    before the last (the plan budget, `plans`)."""
    per_bytes = [_per_byte(version, kind, proto, nranks) for kind, proto, _, _ in tasks]
    counted, counted_per = tasks, per_bytes
    least = _min_traffic(version)
    nmax = max(1, max_channels)
    nch = max(1, min(sum(t[3] for t in counted), nmax))
    if version < CELL_TRAFFIC_FROM:
        total = sum(t[2] * pb for t, pb in zip(counted, counted_per, strict=True))
        budget = max(least, total // nch)
    else:
        total = sum(max(least, t[2] * pb) for t, pb in zip(counted, counted_per, strict=True))
        budget = div_up(total // nch, 16) * 16 if version >= BUDGET_ROUNDED_FROM else max(least, total // nch)
    channel, current = 0, 0
    for (_, _, count, _), per_byte in zip(tasks, per_bytes, strict=True):
        cell = 16 if version < CELL_TRAFFIC_FROM else div_up(div_up(least, per_byte), 16) * 16
        per_cell = cell * per_byte
        cells = div_up(count, cell)
        per_channel = min(cells, div_up(budget, per_cell))
        if channel + 1 == nmax:
            lo = cells
        elif version < CELL_TRAFFIC_FROM:
            lo = min(cells, (budget - current) // per_cell)
        else:
            lo = min(cells, div_up(budget - current, per_cell))
        n_mid = (cells - lo) // per_channel if per_channel else 0
        hi = (cells - lo) % per_channel if per_channel else 0
        if nmax < channel + (1 if lo else 0) + n_mid + (1 if hi else 0):  # overflow: the rest on the last channel
            n_mid = nmax - channel - 2
            per_channel = (cells - lo) // (n_mid + 1)
            hi = per_channel + (cells - lo) % (n_mid + 1)
        if hi == 0 and n_mid != 0:
            hi, n_mid = per_channel, n_mid - 1
        if lo == 0:  # the least channel skipped: the next one is the new least
            channel += 1
            if n_mid == 0:
                lo, hi = hi, 0
            else:
                lo, n_mid = per_channel, n_mid - 1
        parts = [lo * cell] + [per_channel * cell] * n_mid + ([hi * cell] if hi else [])
        parts[-1 if hi else 0] -= cells * cell - count
        used = len(parts)
        yield channel, tuple(parts)
        if hi:
            channel += used - 1
            current = hi * cell * per_byte
        elif n_mid:
            channel += used
            current = 0
        else:
            current += lo * cell * per_byte
        if current >= budget and channel + 1 != nmax:
            channel, current = channel + 1, 0


def _per_byte(version: tuple[int, int], kind: str, proto: str, nranks: int) -> int:
    """A task's traffic per byte as `scheduleCollTasksToPlan` counts it: its function's, 4 x for LL from 2.26."""
    pb = traffic_per_byte(kind, nranks)
    return 4 * pb if proto == "LL" and version >= LL_TRAFFIC_X4_FROM else pb


def channel_bytes(dealt: Sequence[tuple[int, tuple[int, ...]]]) -> list[int]:
    """The bytes of count each channel carries over a plan's dealt tasks (channel 0 first)."""
    width = max((lo + len(parts) for lo, parts in dealt), default=1)
    per = [0] * width
    for lo, parts in dealt:
        for i, b in enumerate(parts):
            per[lo + i] += b
    return per


Task = tuple[str, str, int, int, object, bool]  # (function, protocol, count bytes, nMaxChannels, kernel, NVLS)


def plans(
    version: tuple[int, int],
    nranks: int,
    tasks: Sequence[Task],
    channels: int,
    nvls_channels: int = 0,
    persistent: bool = False,
) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """A group's collective tasks (in NCCL's plan order: those not NVLS, then NVLS) cut into the plans NCCL 2.22+
    launches one after another (`ncclLaunchPrepare`), each plan a list of (task index, first channel, parts).
    `tasks`: (function, protocol, count in bytes, its aggregate's nMaxChannels, its kernel (devFuncId: any key
    equal for equal kernels), NVLS); `channels` / `nvls_channels`: the communicator's. Per plan,
    `scheduleCollTasksToPlan` first guesses the tasks it holds (4 works a batch) and deals their traffic over their
    channels; each task then needs room for one new batch per channel it spans (`ncclTestBudget`: the batches in
    the kernel's 4 KiB arguments past their 32-byte header, 254; the works in half the work FIFO unless
    `persistent`, a CUDA graph's) or the plan ends; `addWorkBatchToPlan` opens a batch on a channel for another
    kernel, past 1024 bytes of works, or (an extension) past 64 works from its base. Before 2.22: one plan."""
    if version < SPLIT_FROM:
        return [[(i, 0, (t[2],)) for i, t in enumerate(tasks)]]
    ws = work_bytes(version)
    in_args = ARGS_BYTES - ARGS_HEADER
    out_args = (1 << 30) if persistent else FIFO_BYTES // 2

    def fits(batches: int, works: int) -> bool:
        batch = batches * BATCH_BYTES
        return batch + works <= in_args or (batch <= in_args and works <= out_args)

    out: list[list[tuple[int, int, tuple[int, ...]]]] = []
    start = 0
    while start < len(tasks):
        guess = 0
        while start + guess < len(tasks) and fits(div_up(guess, 4), (guess + 1) * ws):
            guess += 1
        held = list(range(start, start + guess))
        plan: list[tuple[int, int, tuple[int, ...]]] = []
        batches, works = 0, 0
        tail: dict[int, tuple[object, int]] = {}  # channel -> its last batch's (kernel, base offset)
        filled: dict[int, int] = {}  # channel -> the works' bytes of its batch (and extensions)
        full = False
        for nvls in (False, True):
            mine = [i for i in held if tasks[i][5] == nvls]
            if not mine or full:
                continue
            most = nvls_channels if nvls else channels
            dealt = _placements(
                version, nranks, [(tasks[i][0], tasks[i][1], tasks[i][2], tasks[i][3]) for i in mine], most
            )
            for i, (lo, parts) in zip(mine, dealt, strict=False):
                span = max(1, len(parts))
                if not fits(batches + span, works + ws):
                    full = True
                    break
                for c in range(lo, lo + span):
                    last = tail.get(c)
                    new = last is None or last[0] != tasks[i][4] or filled[c] + ws > MAX_BATCH_BYTES
                    if new or works - last[1] > EXTEND_PAST * ws:  # type: ignore[index]
                        batches += 1
                        tail[c] = (tasks[i][4], works)
                        if new:
                            filled[c] = 0
                    filled[c] += ws
                plan.append((i, lo, parts))
                works += ws
        if not plan:  # NCCL places at least one task a plan (a lone task fits an empty one)
            plan = [(start, 0, (tasks[start][2],))]
        out.append(plan)
        start += len(plan)
    return out
