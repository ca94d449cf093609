"""nccl-tests on a simulated topology: its tests, sizes and counts, the timing loop, and its table format.

`phantora nccl-tests` (phantora/commands/nccl_tests.py) is the command; this module is the part that needs no
command line, so it can be used from Python too:

    from phantora.report.nccl_tests import TESTS, bench_size, table_header, size_line

Conventions follow nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu and util.cu):
- sizes take K, M and G suffixes in powers of 1024; the loop is min, min*f, ... (f > 1) or min, min+i, ...;
- the printed size is the larger of the send and receive buffers, the count the elements of the call's count
  argument, and all-gather, reduce-scatter and all-to-all round their per-rank count down to 16 bytes;
- time is the mean time of one iteration in us; algbw is bytes / time and busbw is algbw times the test's
  factor, both in GB/s (1e9 bytes/s);
- every size prints an out-of-place and an in-place column group. phantora moves no data, so both come from
  the same simulation; the #wrong column is 0 with -c 1 or more (NCCL is taken to be correct) and N/A with -c 0;
- -d all and -o all run every datatype (fp8 on compute capability 9.0 or later only) and every op, -r -1 every root
  of broadcast and reduce, one table line per size of each, as nccl-tests' RunTest loops do.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.dag import MessageCounters
from phantora.collectives.nccl import runs_as_one, settings
from phantora.collectives.nccl.empty_call import discards_empty, empty_ns_per_call
from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow, NetworkSimulator
from phantora.perfmodel.gpus import get_gpu
from phantora.report.host_launch import host_ns_per_call
from phantora.report.nccl_tests_iters import cpu_time_ns, event_intervals, iter_stats
from phantora.topology.model import Topology

FORMAT_VERSION = "2.19.6"  # the nccl-tests release whose header and table layout this prints
NCCL_VERSION_CODE = 23000  # NCCL 2.30.0, whose tuning model phantora.collectives.nccl restates (nccl-headers=...)
FP8_MIN_COMPCAP = 90  # nccl-tests drops f8e4m3 and f8e5m2 from `-d all` below compute capability 9.0


@dataclass(frozen=True)
class BenchSpec:
    """One nccl-tests binary: the collective it times and how it counts bytes."""

    name: str  # e.g. all_reduce_perf
    kind: str  # phantora collective kind; send_recv: every rank sends to the next and receives from the previous
    layout: str  # "full": one buffer of the size; "per_rank": nranks blocks of a 16-byte aligned count
    factor: Callable[[int], float]  # busbw / algbw, as a function of the number of ranks
    has_op: bool  # prints the reduction op (else "none")
    rooted: bool  # prints the root (else -1)


TESTS: dict[str, BenchSpec] = {
    t.name: t
    for t in (
        BenchSpec("all_reduce_perf", "all_reduce", "full", lambda n: 2 * (n - 1) / n, True, False),
        BenchSpec("all_gather_perf", "all_gather", "per_rank", lambda n: (n - 1) / n, False, False),
        BenchSpec("reduce_scatter_perf", "reduce_scatter", "per_rank", lambda n: (n - 1) / n, True, False),
        BenchSpec("alltoall_perf", "all_to_all", "per_rank", lambda n: (n - 1) / n, False, False),
        BenchSpec("broadcast_perf", "broadcast", "full", lambda n: 1.0, False, True),
        BenchSpec("reduce_perf", "reduce", "full", lambda n: 1.0, True, True),
        BenchSpec("sendrecv_perf", "send_recv", "full", lambda n: 1.0, True, False),
        BenchSpec("gather_perf", "gather", "per_rank", lambda n: (n - 1) / n, False, True),
        BenchSpec("scatter_perf", "scatter", "per_rank", lambda n: (n - 1) / n, False, True),
        BenchSpec("hypercube_perf", "hypercube", "per_rank", lambda n: 1.0, False, False),
    )
}
# the tests that run as one NCCL group of send/recv pairs (sendrecv.cu; gather.cu and scatter.cu: ncclGather /
# ncclScatter from NCCL 2.28, before that a group of ncclSend / ncclRecv with the root; either is one p2p group)
P2P_KINDS = ("send_recv", "gather", "scatter")
# hypercube.cu: log2(n) steps, each its own group of ncclSend / ncclRecv with rank ^ 2^k of 2^k blocks
HYPERCUBE = "hypercube"


def hypercube_steps(nranks: int) -> int:
    """The groups of one hypercube_perf call: log2(nranks) (its masks 1, 2, 4, ... below nranks)."""
    return max(0, nranks.bit_length() - 1)


def check_hypercube(nranks: int, agg: int) -> None:
    """hypercube_perf's peers are rank ^ 2^k, which NCCL refuses outside the communicator: a power-of-two rank
    count only. Its groups nest inside -m's group (ncclGroupStart / End), where NCCL would run every step at once:
    -m above 1 is not modelled."""
    if nranks & (nranks - 1):
        raise InputError(f"hypercube_perf exchanges with rank ^ 2^k: {nranks} ranks is not a power of two (NCCL "
                         "refuses a peer outside the communicator)", field="--np")  # fmt: skip
    if agg > 1:
        raise InputError("hypercube_perf with -m above 1 is not modelled (its steps' groups nest in -m's)", field="-m")


def p2p_pairs(kind: str, ranks: Sequence[int], root: int) -> list[tuple[int, int]]:
    """The (sender, receiver) pairs of one call of a p2p test: sendrecv every rank to the next; gather every other
    rank to the root (the communicator's rank `root`), scatter the root to every other. The root's own block is a
    copy inside its GPU, not a transfer."""
    n = len(ranks)
    if kind == "send_recv":
        return [(ranks[i], ranks[(i + 1) % n]) for i in range(n)] if n > 1 else []
    r = ranks[root]
    others = [x for x in ranks if x != r]
    return [(x, r) for x in others] if kind == "gather" else [(r, x) for x in others]


# nccl-tests datatype names -> (phantora collective dtype, bytes per element); aliases accepted on input
DATATYPES: dict[str, tuple[str, int]] = {
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
    "int32": ("int32", 4),
    "uint32": ("int32", 4),
    "int64": ("int64", 8),
    "uint64": ("int64", 8),
    "half": ("fp16", 2),
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "bfloat16": ("bf16", 2),
    "f8e4m3": ("fp8", 1),
    "f8e5m2": ("fp8", 1),
}
DATATYPE_ALIASES = {
    "char": "int8",
    "int": "int32",
    "fp16": "half",
    "float16": "half",
    "fp32": "float",
    "float32": "float",
    "fp64": "double",
    "float64": "double",
    "bf16": "bfloat16",
}
REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum")
MAX_SIZES = 10_000  # more sizes than this is a typo (-i 1 up to 8G), not a benchmark

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?:([kKmMgG])(?:i?[bB])?)?\s*$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _nearest(name: str, known: Sequence[str]) -> str:
    """ "; did you mean X?" for the known name nearest `name`, or "" when none is near."""
    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f"; did you mean {near[0]}?" if near else ""


def find_test(name: str) -> BenchSpec:
    """The test named `name` (all_reduce_perf; the _perf may be left out); InputError naming TEST otherwise."""
    key = name if name.endswith("_perf") else f"{name}_perf"
    if key not in TESTS:
        raise InputError(f"unknown test {name!r}{_nearest(key, list(TESTS))} (known: {', '.join(TESTS)})", field="TEST")
    return TESTS[key]


def parse_size(text: str, flag: str) -> int:
    """nccl-tests' size syntax: bytes, or a number with a K, M or G suffix in powers of 1024 ('8G' = 8 * 2**30,
    '1.5K' = 1536; 'KB', 'KiB' spellings too). InputError naming `flag` otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise InputError(
            f"invalid size {text!r}: bytes, or a number with a K, M or G suffix (powers of 1024, as nccl-tests)",
            field=flag,
        )
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def datatype(name: str) -> str:
    """The nccl-tests name of a datatype (aliases such as bf16, fp32 accepted); InputError naming -d."""
    key = DATATYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DATATYPES:
        near = _nearest(key, [*DATATYPES, *DATATYPE_ALIASES])
        raise InputError(f"unknown datatype {name!r}{near} (known: {', '.join(DATATYPES)}, all)", field="-d")
    return key


def redop(name: str) -> str:
    """A reduction op name as nccl-tests takes it; InputError naming -o otherwise."""
    if name not in REDOPS:
        raise InputError(f"unknown reduction op {name!r}{_nearest(name, REDOPS)} (known: {', '.join(REDOPS)}, all)",
                         field="-o")  # fmt: skip
    return name


def datatypes(name: str, compcap: int) -> list[str]:
    """The datatypes `-d name` runs: one, or with `all` every type nccl-tests knows (the fp8 types only on compute
    capability 9.0 or later, as nccl-tests filters them)."""
    if name.lower() != "all":
        return [datatype(name)]
    return [d for d in DATATYPES if compcap >= FP8_MIN_COMPCAP or not d.startswith("f8")]


def check_fp8(spec: BenchSpec, types: Sequence[str], compcap: int) -> None:
    """NCCL refuses to reduce fp8 below compute capability 9.0 ("FP8 reduction support begins with sm90 capable
    devices"): an InputError naming -d for a reducing test; fp8 all-gather, broadcast, all-to-all and send/recv
    are fine."""
    reduces = spec.kind in ("all_reduce", "reduce_scatter", "reduce")
    fp8 = [t for t in types if t.startswith("f8")]
    if reduces and fp8 and compcap < FP8_MIN_COMPCAP:
        raise InputError(
            f"{fp8[0]}: NCCL reduces fp8 only on compute capability 9.0 or later, and this GPU is "
            f"{compcap // 10}.{compcap % 10} ({spec.name} reduces)",
            field="-d",
        )


def redops(name: str) -> list[str]:
    """The ops `-o name` runs: one, or every op with `all`."""
    return list(REDOPS) if name == "all" else [redop(name)]


@dataclass(frozen=True)
class Run:
    """One block of table lines: the datatype, op and root nccl-tests prints on each of its lines."""

    datatype: str
    op: str
    root: int


def runs(spec: BenchSpec, types: Sequence[str], ops: Sequence[str], root: int, nranks: int) -> list[Run]:
    """The (datatype, op, root) of each table block, in the order of the test's RunTest loops: types, then ops
    (tests with a reduction op), then roots (rooted tests; root -1 is every rank). Tests without an op print
    "none" and run once per type; tests without a root print -1."""
    if spec.rooted and not -1 <= root < nranks:
        raise InputError(f"root {root} is not one of the {nranks} ranks (or -1: every root)", field="-r")
    shown_ops = list(ops) if spec.has_op else ["none"]
    roots = (list(range(nranks)) if root == -1 else [root]) if spec.rooted else [-1]
    return [Run(t, o, r) for t in types for o in shown_ops for r in roots]


def size_steps(minbytes: int, maxbytes: int, factor: int | None, step: int | None) -> list[int]:
    """The sizes nccl-tests visits: min, min*factor, ... (factor > 1), else min, min+step, ..., up to max."""
    if minbytes > maxbytes:
        raise InputError(f"minbytes {minbytes} is larger than maxbytes {maxbytes}", field="-b")
    if factor is not None and step is not None:
        raise InputError("give a step factor (-f) or a step increment (-i), not both", field="-f/-i")
    if factor is not None and factor < 1:
        raise InputError(f"the step factor must be an integer >= 1, got {factor}", field="-f")
    grow = factor is not None and factor > 1
    inc = 1024**2 if step is None else step  # nccl-tests' default increment: 1M
    if grow and minbytes == 0 and maxbytes > 0:
        raise InputError("a step factor never grows a size of 0: start at -b 1 or more", field="-b")
    if not grow and inc <= 0 and maxbytes > minbytes:
        raise InputError(f"the step increment must be > 0, got {inc}", field="-i")
    sizes = [minbytes]
    while True:
        nxt = sizes[-1] * factor if grow and factor else sizes[-1] + inc
        if nxt > maxbytes or nxt == sizes[-1]:
            return sizes
        sizes.append(nxt)
        if len(sizes) > MAX_SIZES:
            raise InputError(
                f"more than {MAX_SIZES} sizes from {minbytes} to {maxbytes}: use a larger step", field="-i"
            )


def warmup_sizes(minbytes: int, maxbytes: int) -> list[int]:
    """The sizes nccl-tests warms up before it measures any: min, 2 min, 4 min, ... up to max (whatever -f or -i
    say); a minimum of 0 warms up 0 alone (nccl-tests would loop on it forever)."""
    if minbytes == 0:
        return [0]
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= 2
    return sizes


def counts(spec: BenchSpec, size: int, elt: int, nranks: int) -> tuple[int, int, int]:
    """(printed size in bytes, printed count, the collective's nbytes) of one size, as nccl-tests counts them.

    "full" tests use one buffer of size // elt elements. all_gather, reduce_scatter and alltoall give each rank
    (count / nranks) elements rounded down to a multiple of 16 bytes: the count printed is that per-rank count,
    the size printed and the collective's nbytes (phantora's convention: the gathered output, the scattered
    input, the whole send buffer) are nranks times it."""
    count = size // elt
    if spec.layout == "full":
        return count * elt, count, count * elt
    base = (count // nranks) & ~(16 // elt - 1)
    total = base * nranks * elt
    if spec.kind == HYPERCUBE:  # hypercube.cu's bandwidth counts the n - 1 blocks a rank receives
        return total, base, base * (nranks - 1) * elt
    return total, base, total


@dataclass
class SizeResult:
    """One line of the table."""

    size: int  # printed size (bytes)
    count: int  # printed count (elements)
    nbytes: int  # the collective's nbytes
    iter_ns: list[int]  # each measured iteration's time (of its -m calls)
    factor: float
    choice: dict[str, Any] | None = None
    agg: int = 1  # calls per iteration (-m)
    inplace_ns: list[int] | None = None  # the in-place iterations' times where they differ (one rank), else None
    gpu_ns: list[int] | None = None  # each iteration's GPU time, before the host's launches bound it
    inplace_gpu_ns: list[int] | None = None  # the same of the in-place group where it differs
    launch_ns: int = 0  # the host's launch time of one iteration (its -m calls; all of them under -z)
    blocking: bool = False  # -z: the host waited for each call inside the timed loop
    comm_ns: list[float] | None = None  # NCCL_TESTS_SPLIT: each communicator's mean call time (process 0's first)
    host_ns: list[int] | None = None  # process 0's own iterations where -a combined iter_ns (-C's host time)
    inplace_host_ns: list[int] | None = None  # the same of the in-place group where it differs

    def in_place(self) -> SizeResult:
        """The in-place column group's figures: this result, or its in-place times where they differ."""
        if self.inplace_ns is None:
            return self
        return SizeResult(self.size, self.count, self.nbytes, self.inplace_ns, self.factor, self.choice, self.agg,
                          gpu_ns=self.inplace_gpu_ns, launch_ns=self.launch_ns, blocking=self.blocking,
                          host_ns=self.inplace_host_ns)  # fmt: skip

    @property
    def cpu_time_us(self) -> float:
        """nccl-tests' -C time of one call (us): the host's time in the timed loop over iterations x calls (process
        0's own: -a combines only the time the bandwidths come from, common.cu)."""
        own = self.host_ns if self.host_ns is not None else self.iter_ns
        n = len(own) * self.agg
        return cpu_time_ns(own, self.launch_ns, self.blocking) / n / 1e3 if n else 0.0

    def iter_us(self) -> list[float]:
        """-I's time of each iteration (us, per call): between its CUDA events, over its -m calls."""
        gpu = self.gpu_ns if self.gpu_ns is not None else self.iter_ns
        return [t / self.agg / 1e3 for t in event_intervals(gpu, self.launch_ns, self.blocking)]

    @property
    def time_ns(self) -> float:
        """The mean time of one call: the measured iterations' time over iterations x calls each."""
        return sum(self.iter_ns) / len(self.iter_ns) / self.agg if self.iter_ns else 0.0

    @property
    def time_us(self) -> float:
        return self.time_ns / 1e3

    @property
    def algbw(self) -> float:
        """GB/s (1e9 bytes/s); 0 when the time is 0 (one rank, or no bytes: no traffic to time)."""
        sec = self.time_ns / 1e9
        return self.nbytes / 1e9 / sec if sec > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * self.factor


@dataclass
class Iteration:
    """The flows of one call, and the flows whose completion means every rank is done."""

    flows: list[Flow]
    last: set[int]
    next_id: int
    choice: dict[str, Any] | None = None


def build_iteration(
    spec: BenchSpec,
    ranks: Sequence[int],
    nbytes: int,
    dtype: str,
    root: int,
    topo: Topology,
    opts: AlgoOptions,
    first_id: int,
    tag: str,
    sent: MessageCounters | None = None,
    redop: str = "sum",
    calls: int = 1,
    step: int = 0,
) -> Iteration:
    """Decompose one call of the test. sendrecv: every rank r sends nbytes to r+1 and receives from r-1 at once,
    in one NCCL group on the test's communicator (n send_recv collectives, one per pair, on `ranks`' p2p channels
    and connections); the others: one collective over `ranks`. `sent`: the run's network connections' message
    counters (None: this call's alone). `calls`: -m's calls in the call's NCCL group (Collective.group_calls; run
    as one where NCCL runs them in one launch, runs_as_one; sendrecv's pairs each take them). The choice recorded
    is the one of NCCL's model's longest time: sendrecv's group is one launch with every pair in flight, so its
    slowest pair (one across nodes) bounds the call."""
    n = len(ranks)
    if spec.kind == HYPERCUBE:  # step k: every rank swaps 2^k blocks with rank ^ 2^k
        mask = 1 << step
        block = nbytes // max(1, n - 1)
        pairs = [(ranks[i], ranks[i ^ mask]) for i in range(n)]
        colls = [
            (
                Collective("send_recv", pair, block * mask, dtype, None, tuple(ranks), tuple(pairs)),
                f"{tag}/s{step}/r{i}",
            )
            for i, pair in enumerate(pairs)
        ]
    elif spec.kind in P2P_KINDS:
        pairs = p2p_pairs(spec.kind, ranks, root)  # sendrecv on one rank: a local copy
        if nbytes == 0 and discards_empty(spec.kind, settings(opts).nccl_version):
            pairs = []  # ncclGather / ncclScatter of count 0 (2.28+): NCCL discards them, no transfer runs
        per_pair = nbytes if spec.kind == "send_recv" else nbytes // n  # gather, scatter: one rank's block each
        comm = tuple(ranks)
        group = tuple(pairs)  # one NCCL group: every pair in flight at once
        colls = [
            (Collective("send_recv", pair, per_pair, dtype, None, comm, group, group_calls=calls), f"{tag}/r{i}")
            for i, pair in enumerate(pairs)
        ]
    else:
        colls = [(_collective(spec, ranks, nbytes, dtype, root, redop, calls), tag)]
    flows: list[Flow] = []
    last: set[int] = set()
    choice = None
    next_id = first_id
    for coll, t in colls:
        dag = decompose(coll, topo, opts, first_flow_id=next_id, tag=t, sent=sent)
        flows.extend(dag.flows)
        last.update(i for ids in dag.rank_last.values() for i in ids)
        next_id = dag.next_id
        got = getattr(dag, "choice", None)
        if got and (choice is None or got["model_time_us"] > choice["model_time_us"]):
            choice = dict(got)  # one launch for the group, all pairs at once: the slowest pair bounds it
    return Iteration(flows, last, next_id, choice)


def _collective(
    spec: BenchSpec, ranks: Sequence[int], nbytes: int, dtype: str, root: int, redop: str, group: int
) -> Collective:
    """The collective of one call of a test other than sendrecv, one of `group` in its NCCL group (-m)."""
    op = redop if spec.has_op else "sum"  # a test without an op prints "none"; NCCL's call takes ncclSum
    root_of = root if spec.rooted else None
    api = spec.kind == "all_to_all"  # alltoall.cu: ncclAlltoAll from NCCL 2.28 (before, a send/recv group)
    return Collective(spec.kind, tuple(ranks), nbytes, dtype, root_of, redop=op, alltoall_api=api, group_calls=group)


@dataclass
class Traffic:
    """Every flow a run submitted and every completion its engine returned: --out's flows.csv and links.csv."""

    flows: dict[int, Flow] = field(default_factory=dict)
    completions: list[Completion] = field(default_factory=list)

    def submitted(self, flows: Sequence[Flow]) -> None:
        self.flows.update((f.id, f) for f in flows)


def run_iteration(sim: NetworkSimulator, it: Iteration, traffic: Traffic | None = None) -> int:
    """Submit the call's flows now and run until every rank is done; its time in ns (0 without flows). `traffic`
    (if given) keeps the flows and every completion the engine returns.

    Nothing else is submitted before the call ends and every flow of it is an ancestor of a rank's last flow (or
    one), so the call is one drain of the network: the same events as stopping at each last flow in turn, without
    a stop (a decomposed engine's round) at each. The rest of the last completion's ns runs too, as a watched
    stop runs it, so the next call starts on the same state. Flows already in flight (none in nccl-tests' loop)
    fall back to watching the call's own: a drain would wait on them too."""
    start = sim.now()
    if traffic is not None:
        traffic.submitted(it.flows)
    if not it.last:
        if it.flows:
            sim.submit(it.flows, start)
        return 0
    busy = sim.in_flight() > 0
    if it.flows:
        sim.submit(it.flows, start)
    if busy:
        return _watch_last(sim, it.last, start, traffic)
    got = sim.drain()
    rest = sim.advance(sim.now())
    if traffic is not None:
        traffic.completions += got + rest
    ends = [c.end_ns for c in got if c.flow_id in it.last]
    if len(ends) < len(it.last):
        raise PhantoraError(f"the network stopped with {len(it.last) - len(ends)} flows of the collective unfinished")
    return max(start, *ends) - start


def _watch_last(sim: NetworkSimulator, last: set[int], start: int, traffic: Traffic | None = None) -> int:
    """Run until every flow of `last` has completed, stopping at each (other flows stay in flight); the time from
    `start` to the last of them (`traffic`: as `run_iteration`)."""
    pending = set(last)
    end = start
    while pending:
        got = sim.advance_watching(INF_NS, pending)
        if traffic is not None:
            traffic.completions += got
        hit = [c for c in got if c.flow_id in pending]
        if not hit:
            raise PhantoraError(f"the network stopped with {len(pending)} flows of the collective unfinished")
        for c in hit:
            pending.discard(c.flow_id)
            end = max(end, c.end_ns)
    return end - start


@dataclass
class Bench:
    """What a benchmark run needs besides the engine."""

    spec: BenchSpec
    topo: Topology
    ranks: tuple[int, ...]
    datatype: str  # nccl-tests name
    root: int = 0
    iters: int = 20
    warmup: int = 5
    op: str = "sum"  # nccl-tests' -o (NCCL's symmetric kernels reduce only a sum)
    opts: AlgoOptions = field(default_factory=AlgoOptions)
    next_id: int = 0
    sent: MessageCounters = field(default_factory=dict)  # network connections' message counters, over the run
    gpus_per_thread: int = 1  # -g: one host thread enqueues and launches this many GPUs' calls, one after another
    agg: int = 1  # -m: calls per iteration, launched as one NCCL group (one host launch per GPU for all of them)
    blocking: bool = False  # -z 1, 2 or 3: the host waits for each call to end before it launches the next
    graph: bool = False  # -G: the calls replay from a CUDA graph, so no host launch sits between them
    traffic: Traffic | None = None  # every flow and completion of the run, kept for --out (None: not kept)


def launch_bound(gpu_ns: Sequence[int], host_ns: int, blocking: bool = False) -> list[int]:
    """Each measured iteration's share of the timed loop when the host launches iteration i by (i + 1) x host_ns
    and the GPUs run one iteration after another: iteration i starts at max(its launch, the previous one's end).
    nccl-tests times the loop from the host's first launch to the last end, over the iterations. `blocking` (-z):
    the host launches each iteration only once the previous one has ended, so each costs host_ns + its GPU time."""
    if blocking:
        return [host_ns + g for g in gpu_ns]
    out: list[int] = []
    end = 0
    for i, g in enumerate(gpu_ns):
        start = max((i + 1) * host_ns, end)
        out.append(start + g - end)
        end = start + g
    return out


def _call(
    bench: Bench, sim: NetworkSimulator, nbytes: int, tag: str, group: int = 1
) -> tuple[int, dict[str, Any] | None]:
    """Run one call of `nbytes` (`group` of them as one kernel) on `sim` now: its time in ns and NCCL's choice.
    hypercube_perf: its steps one after another (each a group NCCL launches once the previous one has ended)."""
    if bench.spec.kind == HYPERCUBE:
        total, choice = 0, None
        for k in range(hypercube_steps(len(bench.ranks))):
            it = build_iteration(bench.spec, bench.ranks, nbytes, DATATYPES[bench.datatype][0], bench.root,
                                 bench.topo, bench.opts, bench.next_id, tag, bench.sent, step=k)  # fmt: skip
            bench.next_id = it.next_id
            total += run_iteration(sim, it, bench.traffic)
            choice = it.choice or choice  # the last step's, the largest
        return total, choice
    dtype = DATATYPES[bench.datatype][0]
    it = build_iteration(
        bench.spec,
        bench.ranks,
        nbytes,
        dtype,
        bench.root,
        bench.topo,
        bench.opts,
        bench.next_id,
        tag,
        bench.sent,
        bench.op,
        group,
    )
    bench.next_id = it.next_id
    return run_iteration(sim, it, bench.traffic), it.choice


def warm_up(bench: Bench, sim: NetworkSimulator, sizes: Sequence[int], calls: int) -> None:
    """nccl-tests' warm-up: `calls` calls of each size in `sizes` (warmup_sizes), before any size is measured."""
    elt = DATATYPES[bench.datatype][1]
    for size in sizes:
        nbytes = counts(bench.spec, size, elt, len(bench.ranks))[2]
        for i in range(calls):
            _call(bench, sim, nbytes, f"nccl/{size}/w{i}")


@dataclass(frozen=True)
class SizePlan:
    """One size's calls: the printed size and count, the collective's nbytes, and the calls of each iteration
    (`calls` of `group` each: -m's calls as one launch where NCCL runs them as one, else one at a time)."""

    size: int
    printed: int
    count: int
    nbytes: int
    calls: int
    group: int


def plan_size(bench: Bench, size: int) -> SizePlan:
    """How nccl-tests' -n iterations of `size` run: -m's group of calls in one launch where NCCL runs it as one
    (runs_as_one: one symmetric kernel on their total (symmetric_sched.cc), one legacy aggregate (coll_group.py),
    or each peer's p2p operations in turn (p2p_calls.py)), else its calls one after another."""
    elt = DATATYPES[bench.datatype][1]
    printed, count, nbytes = counts(bench.spec, size, elt, len(bench.ranks))
    launched = nbytes > 0 or not discards_empty(bench.spec.kind, settings(bench.opts).nccl_version)
    one = bench.agg > 1 and launched and len(bench.ranks) > 1  # -m's empty calls NCCL launches: one group too
    if one:
        dtype = DATATYPES[bench.datatype][0]
        spec = bench.spec
        if spec.kind in P2P_KINDS:
            coll = Collective("send_recv", tuple(bench.ranks[:2]), nbytes, dtype, group_calls=bench.agg)
        else:
            coll = _collective(spec, bench.ranks, nbytes, dtype, bench.root, bench.op, bench.agg)
        one = runs_as_one(coll, bench.topo, bench.opts)
    return SizePlan(size, printed, count, nbytes, 1 if one else bench.agg, bench.agg if one else 1)


def call_tag(bench: Bench, plan: SizePlan, i: int, a: int) -> str:
    """The flows' tag of measured iteration i's call a."""
    return f"nccl/{plan.size}/i{i}" + (f".{a}" if bench.agg > 1 and plan.calls > 1 else "")


def bench_size(bench: Bench, sim: NetworkSimulator, size: int) -> SizeResult:
    """Warm-up (bench.warmup calls of this size; the command warms every size up front instead, see warm_up) then
    measured iterations of one size, back to back on `sim` (each call starts when the previous one has finished on
    every rank; the engine's state, e.g. congestion control, carries over)."""
    plan = plan_size(bench, size)
    choice = None
    for i in range(bench.warmup):
        got = _call(bench, sim, plan.nbytes, f"nccl/{size}/w{i}")[1]
        choice = choice or got
    times: list[int] = []
    measured = None  # the measured calls' choice: in a group of -m calls NCCL may choose otherwise than for one
    for i in range(bench.iters):
        total = 0
        for a in range(plan.calls):
            elapsed, got = _call(bench, sim, plan.nbytes, call_tag(bench, plan, i, a), plan.group)
            total += elapsed
            measured = measured or got
        times.append(total)
    return finish_size(bench, plan, times, measured or choice)


def finish_size(bench: Bench, plan: SizePlan, times: list[int], choice: dict[str, Any] | None) -> SizeResult:
    """The table line of one size from its iterations' GPU times: one rank's copy, the host's launches."""
    n = len(bench.ranks)
    nbytes = plan.nbytes
    # gather and scatter: the root's thread launches work for every other rank, as an all-to-all's does
    kind = "all_to_all" if bench.spec.kind in ("gather", "scatter") else bench.spec.kind
    if nbytes == 0 and discards_empty(bench.spec.kind, settings(bench.opts).nccl_version):
        # NCCL 2.20+ discards an empty collective before it launches anything (enqueue.cc, taskAppend): the host's
        # path through the API alone, for each of the -m calls, and no GPU time; a graph's launch is not modelled
        # (-G: an empty call captures nothing). A call NCCL launches (a send/recv group of 0 bytes, a collective
        # before 2.20) goes on as any other: its kernel's flows (nccl/empty_kernel.py) and the host's launches
        launch = 0 if bench.graph else empty_ns_per_call(bench.gpus_per_thread) * bench.agg
        return SizeResult(plan.printed, plan.count, nbytes, launch_bound(times, launch, bench.blocking),
                          bench.spec.factor(n), choice, bench.agg, gpu_ns=times, launch_ns=launch,
                          blocking=bench.blocking)  # fmt: skip
    host_ns = 0 if bench.graph else host_ns_per_call(kind, choice, n, bench.gpus_per_thread)
    if bench.spec.kind == HYPERCUBE:  # a launch for each step's group
        host_ns *= hypercube_steps(n)
    inplace = gpu_inplace = None
    gpu = times
    if n == 1 and nbytes > 0:
        # One rank: NCCL copies the buffer on the GPU (enqueue.cc, ncclLaunchOneRank's cudaMemcpyAsync; a p2p
        # call to itself copies too) and an in-place collective does nothing; no network flow times either.
        copy = one_rank_copy_ns(bench.topo, nbytes) * bench.agg
        inplace = [copy if bench.spec.kind in (*P2P_KINDS, "all_to_all") else 0] * len(times)
        times = gpu = [copy] * len(times)
        gpu_inplace = inplace
        inplace = launch_bound(inplace, host_ns * (bench.agg if bench.blocking else 1), bench.blocking)
    elif bench.spec.kind == HYPERCUBE and nbytes > 0:
        # hypercube.cu first copies the rank's own block into its receive buffer with cudaMemcpyAsync, out of place
        # only (in place the block already lies there): a device-to-device copy before the exchanges
        copy = one_rank_copy_ns(bench.topo, nbytes // (n - 1))
        gpu_inplace = list(times)
        times = gpu = [t + copy for t in times]
        inplace = launch_bound(gpu_inplace, host_ns, bench.blocking)
    launch = host_ns * (bench.agg if bench.blocking else 1)
    times = launch_bound(times, launch, bench.blocking)
    return SizeResult(plan.printed, plan.count, nbytes, times, bench.spec.factor(n), choice, bench.agg, inplace,
                      gpu_ns=gpu, inplace_gpu_ns=gpu_inplace, launch_ns=launch, blocking=bench.blocking)  # fmt: skip


def one_rank_copy_ns(topo: Topology, nbytes: int) -> int:
    """A device-to-device copy of nbytes on the topology's GPU: read and write at its memory's peak rate."""
    gpu = get_gpu(topo.gpu_model or "h100")
    return round(2 * nbytes / gpu.mem_bw * 1e9)


# ----- the table ----------------------------------------------------------------------------------------


def fit_float(value: float, width: int) -> str:
    """`value` right-aligned in `width` characters as nccl-tests prints it: 2 decimals if they fit, else 1, else
    none, else exponent notation (cut to the width)."""
    for fmt in (".2f", ".1f", ".0f"):
        text = f"{value:{width}{fmt}}"
        if len(text) <= width:
            return text
    return f"{value:{width}{'.1e' if width >= 7 else '.0e'}}"[:width]


def preamble(
    spec: BenchSpec,
    *,
    nthreads: int,
    ngpus: int,
    minbytes: int,
    maxbytes: int,
    step: str,
    warmup: int,
    iters: int,
    topo: Topology,
    ranks: Sequence[int],
    network: str,
    cc: str | None,
    check: int = 1,
    agg: int = 1,
    graph: int = 0,
    blocking: int = 0,
    unalign: int = 0,
    per_iter_skip: int | None = None,
    parallel_init: bool = False,
    notes: Sequence[str] = (),
    colors: Sequence[int] | None = None,
) -> list[str]:
    """The lines before the table, as nccl-tests prints them (its version line, the test, the run's parameters,
    the devices: simulated GPUs of the topology), with two phantora comment lines after the version line and
    `notes` (more "# phantora: ..." lines) after them. `per_iter_skip`: -I's line, with -K's skip (None: no -I);
    `parallel_init`: -p's line; `colors`: each process's communicator colour (NCCL_TESTS_SPLIT), printed as its
    devices' Group (None: 0)."""
    where = f"topology {topo.name} ({topo.num_ranks} GPUs), network {network}" + (f", cc {cc}" if cc else "")
    wrong = "0 (NCCL taken as correct; -c 0: N/A)" if check else "N/A (-c 0)"
    lines = [
        f"# nccl-tests version {FORMAT_VERSION} nccl-headers={NCCL_VERSION_CODE} nccl-library={NCCL_VERSION_CODE}",
        f"# phantora: a simulation of nccl-tests on {where}",
        f"# phantora: no data moves: in-place repeats the out-of-place simulation, #wrong is {wrong}",
        f"# Collective test starting: {spec.name}",
        f"# nThread {nthreads} nGpus {ngpus} minBytes {minbytes} maxBytes {maxbytes} step: {step} warmup iters: "
        f"{warmup} iters: {iters} agg iters: {agg} validation: {check} graph: {graph} unalign: {unalign}",
    ]
    lines[3:3] = [f"# phantora: {note}" for note in notes]
    lines += [BLOCKING[blocking]] if blocking in BLOCKING else []
    if per_iter_skip is not None:
        skip = f"; summary skips first {per_iter_skip} iterations" if per_iter_skip else ""
        lines.append(f"# Per-Iteration Report: CUDA event timing; i_* uses max over process rows{skip} ")
    lines += ["# Parallel Init Enabled: threads call into NcclInitRank concurrently "] if parallel_init else []
    lines += ["#", "# Using devices"]
    for d in devices(topo, ranks, nthreads, ngpus):
        color = colors[d.rank // (nthreads * ngpus)] if colors is not None else 0
        lines.append(f"#  Rank {d.rank:2d} Group {color:2d} Pid {d.pid:6d} on {d.host:>10s} device {d.device:2d} "
                     f"[{d.node}] {d.name}")  # fmt: skip
    return lines


@dataclass(frozen=True)
class Device:
    """One "#  Rank" line: the rank, its simulated process, host, local GPU index, topology node and GPU name."""

    rank: int
    pid: int
    host: str
    device: int
    node: str
    name: str


def devices(topo: Topology, ranks: Sequence[int], nthreads: int, ngpus: int) -> list[Device]:
    """The ranks' device lines: a simulated process (mpirun rank) per -t x -g GPUs, numbered from this pid."""
    pid = os.getpid()
    local: dict[Any, int] = {}
    name = device_name(topo)
    out = []
    for r in ranks:
        node = topo.nodes[topo.node_of_rank(r)]
        host = f"host{node.host}" if node.host is not None else node.name
        dev = local[host] = local.get(host, -1) + 1
        out.append(Device(r, pid + r // (nthreads * ngpus), host, dev, node.name, name))
    return out


# the line nccl-tests prints after the parameters for each -z mode
BLOCKING = {
    1: "# Blocking Enabled: wait and barrier after each inner iteration (-m) ",
    2: "# Blocking Enabled: wait after each inner iteration (-m), no barrier ",
    3: "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ",
}


def device_name(topo: Topology) -> str:
    """The name CUDA would report for the topology's GPU ("NVIDIA H100 80GB HBM3"), else "simulated <model>"."""
    from phantora.perfmodel.gpus import get_gpu

    try:
        return get_gpu(topo.gpu_model or "").cuda_name or f"simulated {topo.gpu_model}"
    except (InputError, KeyError, ValueError):
        return f"simulated {topo.gpu_model or 'GPU'}"


def compute_capability(topo: Topology) -> int:
    """The topology GPU's compute capability as major x 10 + minor (90 for an H100); 90 when it is not known, as
    the NCCL model takes it."""
    from phantora.perfmodel.gpus import get_gpu

    try:
        major, minor = get_gpu(topo.gpu_model or "h100").capability
    except (InputError, KeyError, ValueError):
        return 90
    return major * 10 + minor if major else 90


def max_bytes_limit(topo: Topology, check: int) -> int | None:
    """The largest size nccl-tests keeps on the topology's GPU: its memory less a reserve of 1 GiB per 16 GiB (at
    most 4 GiB) and 1 GiB more, over the buffers it allocates (send, receive, and the expected result when
    checking: 3, else 2). None when the GPU's memory is not known. (nccl-tests reads the memory CUDA reports,
    a little more than the GPU's data-sheet size phantora knows, so its limit is a few % higher.)"""
    from phantora.perfmodel.gpus import get_gpu

    try:
        mem = get_gpu(topo.gpu_model or "").mem_bytes
    except (InputError, KeyError, ValueError):
        return None
    gib = 1 << 30
    reserve = min(-(-mem // (16 * gib)) * gib, 4 * gib)
    return (mem - reserve - gib) // (3 if check else 2) if mem else None


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"  # util.cu's TIME_STRING_FORMAT


def table_header(cputime: bool = False, timestamps: bool = False, per_iter: bool = False) -> list[str]:
    """The header lines of the table (out-of-place and in-place column groups) as util.cu's writeResultHeader
    prints them: `cputime` (-C) names the time columns cputime, `timestamps` (-S) adds a timestamp column,
    `per_iter` (-I) adds i_min, i_max, i_p99 and i_cv% to each group."""
    time = "cputime" if cputime else "time"
    cols = ("size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
            "i_cv%", timestamps and "timestamp" or "")  # fmt: skip
    units = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
             timestamps and TIMESTAMP_FORMAT or "")  # fmt: skip
    pad = 19 if timestamps else 0

    def row(v: Sequence[str]) -> str:
        head = f"# {v[0]:>10s}  {v[1]:>12s}  {v[2]:>8s}  {v[3]:>6s}  {v[4]:>6s}"
        group = f"  {v[5]:>7s}  {v[6]:>6s}  {v[7]:>6s}  {v[8]:>6s}"
        if per_iter:
            group += f"  {v[9]:>7s}  {v[10]:>7s}  {v[11]:>7s}  {v[12]:>7s}"
        return f"{head}{group}{group} {v[13]:>{pad}s}"

    blank = "# " + " " * 10 + "  " + " " * 12 + "  " + " " * 8 + "  " + " " * 6 + "  " + " " * 6
    if per_iter:
        group = "              out-of-place (+ per-iteration)                                in-place (+ per-iteration)"
    else:
        group = "           out-of-place                       in-place          "
    return ["#", blank + group, row(cols), row(units)]


def group_figures(r: SizeResult, cputime: bool = False) -> tuple[float, float, float]:
    """(time in us, algbw, busbw) of one column group as nccl-tests reports it: with -C the time is the host's CPU
    time per call, and the bandwidths stay those of the measured time (nccl-tests computes them before it picks
    the time to print)."""
    return (r.cpu_time_us if cputime else r.time_us), r.algbw, r.busbw


def size_line(
    res: SizeResult,
    spec: BenchSpec,
    typename: str,
    op: str,
    root: int,
    check: int = 0,
    *,
    cputime: bool = False,
    per_iter_skip: int | None = None,
    timestamp: str | None = None,
) -> str:
    """One size: size, count, type, redop, root, then time, algbw, busbw and #wrong twice (out-of-place,
    in-place); the NCCL model's choice, when the collectives layer reports one, as a trailing comment. #wrong is
    nccl-tests' "%6g" of 0 with `check` (-c) 1 or more, "N/A" with -c 0. `cputime` (-C): the time is the host's
    CPU time; `per_iter_skip` (-I; -K): each group adds i_min, i_max, i_p99 and i_cv% of its iterations after the
    first -K; `timestamp` (-S): "%21s" of it after the groups."""
    shown_op = op if spec.has_op else "none"
    shown_root = root if spec.rooted else -1
    wrong = f"  {0:6g}" if check else "    N/A"

    def group(r: SizeResult) -> str:
        time_us, algbw, busbw = group_figures(r, cputime)
        text = f"  {fit_float(time_us, 7)}  {fit_float(algbw, 6)}  {fit_float(busbw, 6)}{wrong}"
        if per_iter_skip is not None:
            st = iter_stats(r.iter_us()[per_iter_skip:])
            text += "".join(f"  {fit_float(v, 7)}" for v in (st.min, st.max, st.p99, st.cv_pct))
        return text

    body, ip = group(res), group(res.in_place())
    line = f"{res.size:12d}  {res.count:12d}  {typename:>8s}  {shown_op:>6s}  {shown_root:6d}{body}{ip}"
    if timestamp is not None:
        line += f"{timestamp:>21s}"
    if res.choice:
        line += "  # " + " ".join(f"{k}={v}" for k, v in res.choice.items())
    return line


def fallback_note(choice: dict[str, Any] | None) -> str | None:
    """The one comment line for a choice NCCL rated on its ring search's fallback (search.cc logs "Could not find
    a path for pattern 4, falling back to simple order" under NCCL_DEBUG=INFO): why the choice looks odd. None
    for any other choice."""
    if not choice or not choice.get("search_fallback"):
        return None
    return (
        "# NCCL INFO Could not find a path for pattern 4, falling back to simple order: NCCL rates the ring at "
        "0.1 GB/s (its choice, nccl_model_time_us); the flows move at the links' rate (model_time_us)"
    )


def footer(
    results: Sequence[SizeResult], spec: BenchSpec, memory: str | None = None, min_bw: float | None = None
) -> list[str]:
    """The summary as nccl-tests ends its output: out-of-bounds values (always 0: nothing is checked), the mean
    busbw over both column groups of every line, OK or FAILED against `min_bw` (NCCL_TESTS_MIN_BW) if set, the
    test's name, -M's `memory` line if any, a "#" and the empty line nccl-tests prints when NCCL reports no error."""
    avg = avg_busbw(results)
    return [
        f"# {'Out of bounds values':<20s} : 0 OK",
        f"# {'Avg bus bandwidth':<20s} : {avg:g} {bw_verdict(avg, min_bw)}",
        "#",
        f"# Collective test concluded: {spec.name}",
        *([memory] if memory is not None else []),
        "#",
        "",
    ]


def avg_busbw(results: Sequence[SizeResult]) -> float:
    """The "Avg bus bandwidth" of the footer (GB/s): nccl-tests adds each column group's busbw (out-of-place and
    in-place, which differ on one rank) and divides by their number (common.cu BenchTime: bw[0], bw_count[0])."""
    values = [g.busbw for r in results for g in (r, r.in_place())]
    return sum(values) / len(values) if values else 0.0


MIN_BW_ENV = "NCCL_TESTS_MIN_BW"  # nccl-tests' check of the average busbw (GB/s; run() in common.cu)
MIN_BW_SLACK = 0.9  # the average fails below 0.9 x NCCL_TESTS_MIN_BW
CHECK_FAILED_RC = 7  # testNumResults: what nccl-tests' main returns when the check fails
CHECK_FAILED_LINE = 1454  # the line of main's TESTCHECK(result) in v2.19.6 src/common.cu, which prints the failure


def min_bw(env: Mapping[str, str]) -> float | None:
    """NCCL_TESTS_MIN_BW as a float, None where nccl-tests checks nothing (unset, or -1, its "unchecked");
    InputError naming the variable if it is not a number (nccl-tests' atof would read 0: every run passes)."""
    text = env.get(MIN_BW_ENV)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"not a number (GB/s): {text!r}", field=MIN_BW_ENV) from None
    return None if value == -1 else value


def bw_passes(avg: float, floor: float | None) -> bool:
    """nccl-tests' check: the average busbw at or above 0.9 x NCCL_TESTS_MIN_BW (true when unchecked)."""
    return floor is None or avg >= floor * MIN_BW_SLACK


def bw_verdict(avg: float, floor: float | None) -> str:
    """What follows the average on its line: nothing unchecked, else OK or FAILED."""
    return "" if floor is None else ("OK" if bw_passes(avg, floor) else "FAILED")


def check_failure_line(pid: int) -> str:
    """The line nccl-tests' TESTCHECK prints in main when the check failed (host0: rank 0's simulated host)."""
    return f" .. host0 pid {pid}: Test failure common.cu:{CHECK_FAILED_LINE}"
