"""nccl-tests' NCCL_TESTS_SPLIT_MASK and NCCL_TESTS_SPLIT: the MPI processes split into communicators run at once.

nccl-tests (src/common.cu, `run`) gives each MPI process a colour and splits MPI_COMM_WORLD by it; each colour is
one NCCL communicator, and every communicator runs the same test at the same time. Its `Barrier` and `Allreduce`
use the world, so each size starts together on every communicator; each then runs its iterations on its own, and
the time printed is the -a combination (0: process 0's, 1: the mean over every thread of every process, 2: the
minimum, 3: the maximum, 4: the sum) of each thread's time; process 0 prints the line with its own communicator's
counts and bandwidth factor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import INF_NS, NetworkSimulator
from phantora.report.nccl_tests import (
    DATATYPES,
    Bench,
    SizeResult,
    bench_size,
    build_iteration,
    call_tag,
    counts,
    finish_size,
    plan_size,
)
from phantora.report.nccl_tests import warm_up as nt_warm_up

MASK = "NCCL_TESTS_SPLIT_MASK"
SPLIT = "NCCL_TESTS_SPLIT"


def _strtoul(text: str, base: int) -> tuple[int, int]:
    """C's strtoul on `text`: (value, characters read); (0, 0) when no digit is read. Leading spaces and a sign
    are taken, a 0x prefix in base 16 or 0 and a leading 0 (octal) in base 0, as C does; a negative value wraps
    to 64 bits."""
    s = text.lstrip(" \t\n\r\f\v")
    i = len(text) - len(s)
    neg = False
    if s[:1] in ("+", "-"):
        neg = s[0] == "-"
        s, i = s[1:], i + 1
    if base in (0, 16) and s[:2].lower() == "0x" and s[2:3] and s[2].lower() in "0123456789abcdef":
        s, i, base = s[2:], i + 2, 16
    elif base == 0:
        base = 8 if s[:1] == "0" else 10
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"[:base]
    n = 0
    while n < len(s) and s[n].lower() in digits:
        n += 1
    if n == 0:
        return 0, 0
    value = int(s[:n], base)
    return ((-value) % 2**64 if neg else value), i + n


def _as_int(value: int) -> int:
    """C's (int) cast of an unsigned long: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _parse_int(text: str) -> int | None:
    """nccl-tests' parseInt: spaces, then 0b binary or strtoul base 0; None when nothing is read."""
    s = text.lstrip(" \t\n\r\f\v")
    if not s:
        return None
    if s[:2].lower() == "0b":
        value, used = _strtoul(s[2:], 2)
        return _as_int(value)  # nccl-tests takes "0b" alone as 0 (its end pointer moved past the prefix)
    value, used = _strtoul(s, 0)
    return _as_int(value) if used else None


_OPS = (("AND", "&"), ("OR", "|"), ("MOD", "%"), ("DIV", "/"))


def _split_color(spec: str, proc: int) -> int:
    """The colour NCCL_TESTS_SPLIT=`spec` gives process `proc` (common.cu: four independent tests, each a
    case-insensitive prefix and parseInt; a spec none of them reads leaves the colour 0)."""
    color = 0
    for word, sign in _OPS:
        num = None
        for prefix in (word, sign):
            if spec[: len(prefix)].lower() == prefix.lower():
                num = _parse_int(spec[len(prefix) :])
                if num is not None:
                    break
        if num is None:
            continue
        if word in ("MOD", "DIV") and num == 0:
            raise InputError(f"{spec!r}: {word} 0 divides by zero (nccl-tests dies of it)", field=SPLIT)
        if word == "AND":
            color = proc & num
        elif word == "OR":
            color = proc | num
        elif word == "MOD":
            color = int(proc - num * int(proc / num))  # C's %: the sign of the dividend
        else:
            color = int(proc / num)  # C's /: towards zero
    return color


def split_colors(env: Mapping[str, str], nprocs: int) -> list[int] | None:
    """Each MPI process's colour as nccl-tests computes it: NCCL_TESTS_SPLIT_MASK (strtoul base 16) wins, else
    NCCL_TESTS_SPLIT (AND/&, OR/|, MOD/%, DIV// and a number); None when neither is set."""
    if MASK in env:
        mask = _as_int(_strtoul(env[MASK], 16)[0])
        return [proc & mask for proc in range(nprocs)]
    if SPLIT in env:
        return [_split_color(env[SPLIT], proc) for proc in range(nprocs)]
    return None


@dataclass(frozen=True)
class Split:
    """The communicators of a split run: each process's colour and each communicator's ranks (topology ranks, in
    NCCL rank order: by process, then thread and GPU), the one holding process 0 first."""

    colors: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    procs: tuple[int, ...]  # processes in each group


def split_run(colors: Sequence[int], ranks: Sequence[int], per_proc: int) -> Split:
    """Group `ranks` (per_proc of them a process, in process order) by their process's colour, in the order
    MPI_Comm_split keys them (the world rank); process 0's communicator first, then by colour."""
    order = sorted(set(colors), key=lambda c: (c != colors[0], c))
    groups = []
    procs = []
    for c in order:
        members = [p for p, pc in enumerate(colors) if pc == c]
        groups.append(tuple(r for p in members for r in ranks[p * per_proc : (p + 1) * per_proc]))
        procs.append(len(members))
    return Split(tuple(colors), tuple(groups), tuple(procs))


def check_root(split: Split, root: int) -> None:
    """A rooted test's -r on every communicator: a root each of them holds (NCCL refuses another), and -r -1 only
    on communicators of one size (each loops over its own ranks, broadcast.cu / reduce.cu, so unequal ones would
    run different numbers of blocks and never meet at nccl-tests' world barriers)."""
    sizes = sorted({len(g) for g in split.groups})
    if root == -1 and len(sizes) > 1:
        raise InputError(f"-r -1 on communicators of {'/'.join(map(str, sizes))} ranks ({MASK} / {SPLIT}): each "
                         "loops over its own roots, so nccl-tests' world barriers never meet", field="-r")  # fmt: skip
    if root >= sizes[0]:
        raise InputError(f"root {root} is not a rank of every communicator ({MASK} / {SPLIT}: the smallest has "
                         f"{sizes[0]})", field="-r")  # fmt: skip


AVERAGES = (0, 1, 2, 3, 4)  # nccl-tests' -a: process 0's, mean, min, max, sum (common.cu's Allreduce)


def check_average(average: int) -> None:
    """-a is one of nccl-tests' five; any other leaves its MPI_Allreduce without an op (MPI_Op(): the run fails)."""
    if average not in AVERAGES:
        raise InputError(f"{average}: nccl-tests' -a is 0 (process 0's), 1 (mean), 2 (min), 3 (max) or 4 (sum)",
                         field="-a")  # fmt: skip


def combine_times(means: Sequence[float], procs: Sequence[int], nthreads: int, average: int) -> list[Fraction]:
    """The exact weight of each communicator's time in the printed one under -a (`means`: the communicators' mean call
    times, process 0's first; `procs`: their processes; every process runs `nthreads` threads, each timing the
    same calls). nccl-tests' Allreduce combines every thread of every process (MPI_COMM_WORLD, split or not):
    0 process 0's thread 0's; 1 the sum over threads and processes over their number; 2 the minimum; 3 the
    maximum; 4 the sum (so with one communicator np x nthreads times its time)."""
    check_average(average)
    n = len(means)
    if average == 0:
        return [Fraction(i == 0) for i in range(n)]
    if average in (2, 3):
        pick = (min if average == 2 else max)(range(n), key=lambda i: means[i])
        return [Fraction(i == pick) for i in range(n)]
    if average == 1:
        return [Fraction(p, sum(procs)) for p in procs]
    return [Fraction(p * nthreads) for p in procs]


def weighted_iterations(iters: Sequence[Sequence[int]], weights: Sequence[Fraction]) -> list[int]:
    """Each iteration's time combined by `weights` (combine_times), so that the mean over iterations is the -a
    combination of the communicators' means."""
    n = len(iters[0])
    return [round(sum(w * t[i] for w, t in zip(weights, iters, strict=True) if w)) for i in range(n)]


@dataclass
class _Chain:
    """One communicator's calls, run one after another: (tag, nbytes, group) each, and each one's time."""

    bench: Bench
    calls: list[tuple[str, int, int]]
    times: list[int]
    choice: dict[str, Any] | None = None
    pending: set[int] | None = None
    start: int = 0
    end: int = 0


def run_concurrently(sim: NetworkSimulator, chains: Sequence[_Chain]) -> None:
    """Run every chain's calls on `sim` from now: each chain submits its next call when its previous one has
    ended on every rank, whatever the others do (nccl-tests' communicators share no barrier inside a size's
    loop); each call's time goes to its chain's `times`."""
    owner: dict[int, _Chain] = {}
    ids = [max(ch.bench.next_id for ch in chains)] if chains else [0]  # flow ids: one counter for every chain

    def start_next(ch: _Chain) -> None:
        """Submit `ch`'s next call that has flows (an empty one takes no time), or mark the chain done."""
        while len(ch.times) < len(ch.calls):
            tag, nbytes, group = ch.calls[len(ch.times)]
            b = ch.bench
            it = build_iteration(b.spec, b.ranks, nbytes, DATATYPES[b.datatype][0], b.root, b.topo, b.opts,
                                 ids[0], tag, b.sent, b.op, group)  # fmt: skip
            ids[0] = it.next_id
            ch.choice = ch.choice or it.choice
            now = sim.now()
            if b.traffic is not None:
                b.traffic.submitted(it.flows)
            if it.flows:
                sim.submit(it.flows, now)
            if it.last:
                ch.pending, ch.start, ch.end = set(it.last), now, now
                owner.update((f, ch) for f in it.last)
                return
            ch.times.append(0)  # no flow to wait on (no bytes): it takes no time
        ch.pending = None

    for ch in chains:
        start_next(ch)
    while any(ch.pending for ch in chains):
        watch = set().union(*(ch.pending for ch in chains if ch.pending))
        got = sim.advance_watching(INF_NS, watch)
        traffic = next((ch.bench.traffic for ch in chains if ch.bench.traffic is not None), None)
        if traffic is not None:
            traffic.completions += got
        hit = [c for c in got if c.flow_id in watch]
        if not hit:
            raise PhantoraError(f"the network stopped with {len(watch)} flows of the collectives unfinished")
        ended: list[_Chain] = []
        for c in hit:
            ch = owner.pop(c.flow_id)
            assert ch.pending is not None
            ch.pending.discard(c.flow_id)
            ch.end = max(ch.end, c.end_ns)
            if not ch.pending and ch not in ended:
                ended.append(ch)
        for ch in ended:
            ch.times.append(ch.end - ch.start)
            start_next(ch)
    for ch in chains:
        ch.bench.next_id = ids[0]


def warm_up_split(benches: Sequence[Bench], sim: NetworkSimulator, sizes: Sequence[int], calls: int) -> None:
    """nccl-tests' warm-up on every communicator at once: `calls` calls of each size, the sizes one after another
    on each communicator (its warm-up loop waits on its own streams only, completeColl: no world barrier)."""
    chains = []
    for b in benches:
        elt = DATATYPES[b.datatype][1]
        todo = [(size, counts(b.spec, size, elt, len(b.ranks))[2]) for size in sizes]
        chains.append(_Chain(b, [(f"nccl/{size}/w{i}", nbytes, 1) for size, nbytes in todo for i in range(calls)], []))
    run_concurrently(sim, chains)


def bench_split(benches: Sequence[Bench], sim: NetworkSimulator, size: int) -> list[SizeResult]:
    """One size on every communicator at once (they start together, after nccl-tests' world barrier): each
    communicator's table line, as bench_size makes it."""
    plans = [plan_size(b, size) for b in benches]
    chains = []
    for b, p in zip(benches, plans, strict=True):
        calls = [(call_tag(b, p, i, a), p.nbytes, p.group) for i in range(b.iters) for a in range(p.calls)]
        chains.append(_Chain(b, calls, []))
    run_concurrently(sim, chains)
    out = []
    for b, p, ch in zip(benches, plans, chains, strict=True):
        iters = [sum(ch.times[i * p.calls : (i + 1) * p.calls]) for i in range(b.iters)]
        out.append(finish_size(b, p, iters, ch.choice))
    return out


def combined(results: Sequence[SizeResult], procs: Sequence[int], nthreads: int, average: int) -> SizeResult:
    """The line process 0 prints: its communicator's size, count and factor, with the -a combination of every
    thread's time (combine_times) in both column groups; -C's host time and -I's iterations stay process 0's own."""
    first = results[0]
    weights = combine_times([r.time_ns for r in results], procs, nthreads, average)
    iters = weighted_iterations([r.iter_ns for r in results], weights)
    inplace = None
    if any(r.inplace_ns is not None for r in results):
        inplace = weighted_iterations([r.in_place().iter_ns for r in results], weights)
    comm = [r.time_ns for r in results] if len(results) > 1 else None
    own, own_inplace = first, first.in_place() if inplace is not None else None
    return replace(first, iter_ns=iters, inplace_ns=inplace, comm_ns=comm, host_ns=own.iter_ns,
                   inplace_host_ns=own_inplace.iter_ns if own_inplace else None,
                   gpu_ns=_gpu(own), inplace_gpu_ns=_gpu(own_inplace) if own_inplace else None)  # fmt: skip


def _gpu(r: SizeResult) -> list[int]:
    """`r`'s own iterations for -I: nccl-tests' per-iteration times are the maximum over every thread and process
    (common.cu's gather of the iteration times), which -a does not touch."""
    return r.gpu_ns if r.gpu_ns is not None else r.iter_ns


def notes(split: Split | None) -> list[str]:
    """The "# phantora:" line of a split run: its communicators and how the printed time combines them."""
    if split is None or len(split.groups) == 1:
        return []
    sizes = sorted({len(g) for g in split.groups})
    return [
        f"{len(split.groups)} communicators of {'/'.join(map(str, sizes))} ranks run at once "
        f"({MASK} / {SPLIT}); each line is process 0's communicator, its time combined over the processes by -a"
    ]


def warm_up(benches: Sequence[Bench], sim: NetworkSimulator, sizes: Sequence[int], calls: int) -> None:
    """nccl-tests' warm-up: one communicator's as nccl_tests.warm_up runs it, several at once (warm_up_split)."""
    if len(benches) == 1:
        nt_warm_up(benches[0], sim, sizes, calls)
    else:
        warm_up_split(benches, sim, sizes, calls)


def bench(
    benches: Sequence[Bench], sim: NetworkSimulator, size: int, procs: Sequence[int], nthreads: int, average: int
) -> SizeResult:
    """One size's table line: one communicator's as nccl_tests.bench_size measures it (-a changes it only at 4,
    the sum over its processes' threads), several at once (bench_split); combined by -a (combined)."""
    if len(benches) == 1:
        res = bench_size(benches[0], sim, size)
        return res if average != 4 else combined([res], procs, nthreads, average)
    return combined(bench_split(benches, sim, size), procs, nthreads, average)


def describe(split: Split, average: int) -> dict[str, Any]:
    """results.json's record of a split run: each process's colour, each communicator's ranks, and -a."""
    return {"colors": list(split.colors), "communicators": [list(g) for g in split.groups], "average": average}
