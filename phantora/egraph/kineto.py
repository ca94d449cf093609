"""Import PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank, as an execution graph.

What is read (see docs/egraph.md for what cannot be inferred):
- GPU activity: ``ph: "X"`` events of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset``, with
  ``args.stream`` and ``args.correlation`` (the id of the CUDA runtime call that launched them). Their
  recorded durations become compute nodes; streams are numbered densely in order of first use.
- NCCL kernels (name ``ncclKernel_*`` / ``ncclDevKernel_*``, or ``args["Collective name"]``) become
  collectives. Kind, sizes, dtype and group come from the kernel's args (``Collective name``, ``In msg
  nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Ranks``) or, failing that,
  from the CPU op that launched it (same ``External id``); the reduction from the device op in the kernel's name
  (``_Sum_``, ``_MinMax_``, ``_PreMulSum_`` ...; sum if it names none). The kernel's own duration is dropped:
  communication is re-simulated. The NCCL stream waits for the collective's completion, from its next op on
  (the wait is added where first needed, so a rank's async calls on several streams all issue first).
- Process groups: calls are numbered per process group (``Process Group Name``; several groups over the same
  ranks are several communicators, kineto_pg.py), not per set of ranks.
- Order: GPU work on one stream runs in launch order, which is correlation order.
- Cross-stream dependencies: each ``cuda_sync`` "Stream Wait Event" (torch.profiler with
  ``enable_cuda_sync_events``) makes the first op launched on ``stream`` after the wait depend on the
  last op launched on ``wait_on_stream`` before the ``cudaEventRecord`` it names. Without such events,
  only the rule ProcessGroupNCCL always applies is used: an NCCL kernel waits for the work launched
  before it on the other streams.
- Steps: ``ProfilerStep#k`` annotations split GPU work by the launch time of each op; without them
  the whole trace is one step.
- Idle time on a stream that its dependencies do not explain (CPU launch overhead, untraced waits) is
  kept as ``idle`` compute (``gaps="keep"``) or dropped (``gaps="drop"``).
- SPMD replication (``replicate_rank=R``): one rank's trace stands for every rank of the world its
  ``distributedInfo.world_size`` records; each rank runs the same kernels and the same collectives in
  its own group (the group of the same size and stride that holds it).
"""

from __future__ import annotations

import ast
import bisect
import copy
import gzip
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantora.collectives.spec import DTYPE_BYTES, REDUCING
from phantora.egraph.builder import ProgramBuilder, build_graph
from phantora.egraph.format import ExecGraph
from phantora.egraph.kineto_pg import PgTable, pg_name
from phantora.errors import InputError
from phantora.perfmodel.dtypes import short_dtype

# The device op in an NCCL kernel's name (ncclDevKernel_AllReduce_Sum_f32_RING_LL, 2.19+'s MinMax; older
# ncclKernel_AllReduce_RING_LL_Max_float) -> a reduction that NCCL runs with it: its choice follows the device op
# alone (collectives/nccl/redop.py), so a PreMulSum is mulsum (an average of floats runs it too) and a SumPostDiv avg.
_DEV_OP = re.compile(r"_(SumPostDiv|PreMulSum|MinMax|Prod|Max|Min|Sum)_")
_DEV_OPS = {"Sum": "sum", "Prod": "prod", "MinMax": "max", "Max": "max", "Min": "min", "PreMulSum": "mulsum"}
_DEV_OPS["SumPostDiv"] = "avg"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")
# Collective name (lower case, without leading underscores) or kernel name fragment -> kind.
_KIND_RULES = (
    ("reduce_scatter", "reduce_scatter"),
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
)
STEP_STREAM = -1  # Step marks live on a stream of their own so they never delay GPU work


@dataclass
class KinetoReport:
    """Counts of what the import found and inferred."""

    ranks: int = 0
    kernels: int = 0
    collectives: int = 0
    transfers: int = 0
    sync_deps: int = 0  # from cuda_sync Stream Wait Events
    nccl_issue_deps: int = 0  # from the ProcessGroupNCCL rule (no cuda_sync events in the trace)
    idle_ns: int = 0
    steps: int = 0
    notes: list[str] = field(default_factory=list)
    replicated_from: int | None = None  # SPMD replication: the rank whose trace stands for all (counts are its own)


@dataclass
class _Op:
    corr: int
    stream: int
    ts: int  # ns
    dur: int
    name: str
    args: dict[str, Any]
    where: str


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def read_trace(path: str | Path) -> dict[str, Any]:
    """Parse a trace file (.json or .json.gz) into its top-level object; errors name the file."""
    p = Path(path)
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        obj = json.loads(raw)
    except FileNotFoundError:
        raise InputError("trace file not found", file=str(p)) from None
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"corrupt or truncated trace ({exc})", file=str(p)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise InputError("not a Chrome trace: no 'traceEvents' list", file=str(p), field="traceEvents")
    return obj


def _kind(name: str, args: dict[str, Any]) -> str | None:
    coll = str(args.get("Collective name") or "").lower().lstrip("_")
    if coll:
        for frag, kind in _KIND_RULES:
            if frag in coll:
                return kind
        return None
    if not name.startswith(NCCL_PREFIXES):
        return None
    low = name.lower()
    if "sendrecv" in low:
        return "send_recv"
    for frag, kind in _KIND_RULES:
        if frag.replace("_", "") in low:
            return kind
    return None


def _redop(name: str, kind: str) -> str:
    """The reduction of a reducing NCCL kernel, from the device op its name holds (`_DEV_OP`); sum when it names
    none (a generic kernel) or the collective reduces nothing."""
    m = _DEV_OP.search(name) if kind in REDUCING else None
    return _DEV_OPS[m.group(1)] if m else "sum"


def _dtype(args: dict[str, Any]) -> str:
    return short_dtype(args.get("dtype") or "Byte")


def _ranks(args: dict[str, Any], world: int, src: str, where: str) -> tuple[int, ...]:
    size = args.get("Group size")
    text = args.get("Process Group Ranks")
    if text:
        try:
            ranks = ast.literal_eval(str(text))
        except (ValueError, SyntaxError):
            raise InputError(f"cannot parse {text!r}", file=src, field=f"{where}.args.Process Group Ranks") from None
        if ranks and ranks[-1] is Ellipsis:  # long lists are truncated: rebuild them from the stride
            head = [int(r) for r in ranks[:-1]]
            if len(head) < 2 or not size:
                raise InputError("truncated rank list without a stride", file=src, field=f"{where}.args")
            stride = head[1] - head[0]
            ranks = [head[0] + i * stride for i in range(int(size))]
        return tuple(int(r) for r in ranks)
    if size is None or int(size) == world:
        return tuple(range(world))
    raise InputError(
        f"a collective on {size} of {world} ranks without 'Process Group Ranks': its group cannot be inferred",
        file=src,
        field=f"{where}.args",
    )


class _RankImport:
    """Turns one rank's trace into a program."""

    def __init__(self, obj: dict[str, Any], src: str, rank: int, world: int, gaps: str, rep: KinetoReport) -> None:
        self.src, self.rank, self.world, self.gaps, self.rep = src, rank, world, gaps, rep
        self.source_rank: int | None = None  # SPMD replication: the rank that was traced
        self.ops: list[_Op] = []
        self.syncs: list[dict[str, Any]] = []
        self.launch_ts: dict[int, int] = {}
        self.cpu_comm: dict[int, dict[str, Any]] = {}  # External id -> args of the CPU op with comm metadata
        self.step_starts: list[int] = []
        self.pgs = PgTable()  # the job's process groups (`note_groups` fills a shared one before `build`)
        self._scan(obj["traceEvents"])

    def _scan(self, events: list[Any]) -> None:
        for i, ev in enumerate(events):
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            where = f"traceEvents[{i}]"
            cat, args = ev.get("cat"), ev.get("args") or {}
            if not isinstance(args, dict):
                raise InputError("'args' must be an object", file=self.src, field=f"{where}.args")
            if cat in GPU_CATS:
                for key in ("ts", "dur"):
                    if not isinstance(ev.get(key), (int, float)):
                        raise InputError(f"a GPU event needs a numeric '{key}'", file=self.src, field=f"{where}.{key}")
                for key in ("stream", "correlation"):
                    if not isinstance(args.get(key), int):
                        raise InputError(
                            f"a GPU event needs an integer args.{key}", file=self.src, field=f"{where}.args.{key}"
                        )
                self.ops.append(
                    _Op(
                        args["correlation"],
                        args["stream"],
                        _ns(ev["ts"]),
                        _ns(ev["dur"]),
                        str(ev.get("name")),
                        args,
                        where,
                    )
                )
            elif cat == "cuda_sync" and ev.get("name") == "Stream Wait Event":
                self.syncs.append(dict(args, _where=where))
            elif cat == "cuda_runtime" and isinstance(args.get("correlation"), int):
                self.launch_ts[args["correlation"]] = _ns(ev.get("ts", 0))
            elif cat in ("cpu_op", "user_annotation"):
                name = str(ev.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    self.step_starts.append(_ns(ev.get("ts", 0)))
                if "Collective name" in args and isinstance(args.get("External id"), int):
                    self.cpu_comm[args["External id"]] = args
        self.ops.sort(key=lambda o: o.corr)
        self.step_starts.sort()

    def note_groups(self, pgs: PgTable) -> None:
        """Add the process groups this trace's calls name to `pgs`, and number this rank's calls by it."""
        self.pgs = pgs
        for op in self.ops:
            name = self._pg_name(op) if self._is_comm(op) else None
            if name is not None:
                pgs.add(name, _ranks(self._comm_args(op), self.world, self.src, op.where))

    def _pg_name(self, op: _Op) -> str | None:
        ext = op.args.get("External id")
        cpu = self.cpu_comm.get(ext, {}) if isinstance(ext, int) else {}
        return pg_name(op.args) or pg_name(cpu)

    def _comm_args(self, op: _Op) -> dict[str, Any]:
        if "In msg nelems" in op.args or "Out msg nelems" in op.args:
            return op.args
        ext = op.args.get("External id")
        return self.cpu_comm.get(ext, op.args) if isinstance(ext, int) else op.args

    def _cross_deps(self) -> dict[int, list[int]]:
        """Op index -> indices of ops on other streams it waits for."""
        by_stream: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            by_stream.setdefault(op.stream, []).append(i)
        corrs = {s: [self.ops[i].corr for i in idx] for s, idx in by_stream.items()}
        deps: dict[int, list[int]] = {}
        for sync in self.syncs:
            s, ws = sync.get("stream"), sync.get("wait_on_stream")
            rec, corr = sync.get("wait_on_cuda_event_record_corr_id"), sync.get("correlation")
            if not (isinstance(s, int) and isinstance(ws, int) and isinstance(rec, int) and isinstance(corr, int)):
                raise InputError(
                    "a Stream Wait Event needs stream, wait_on_stream, wait_on_cuda_event_record_corr_id, correlation",
                    file=self.src,
                    field=f"{sync['_where']}.args",
                )
            if s not in by_stream or ws not in by_stream or ws == s:
                continue
            k = bisect.bisect_left(corrs[ws], rec) - 1  # last op launched on ws before the event record
            j = bisect.bisect_right(corrs[s], corr)  # first op launched on s after the wait
            if k >= 0 and j < len(by_stream[s]):
                deps.setdefault(by_stream[s][j], []).append(by_stream[ws][k])
                self.rep.sync_deps += 1
        if not self.syncs:  # ProcessGroupNCCL: the NCCL stream waits for the current stream before each collective
            last: dict[int, int] = {}
            for i, op in enumerate(self.ops):
                if self._is_comm(op):
                    others = [j for st, j in last.items() if st != op.stream and not self._is_comm(self.ops[j])]
                    if others:
                        deps.setdefault(i, []).extend(others)
                        self.rep.nccl_issue_deps += len(others)
                last[op.stream] = i
        return deps

    def _is_comm(self, op: _Op) -> bool:
        return op.name.startswith(NCCL_PREFIXES) or "Collective name" in op.args

    def as_rank(self, rank: int, rep: KinetoReport) -> _RankImport:
        """This trace standing for `rank` (SPMD replication), counting into `rep`."""
        other = copy.copy(self)
        other.source_rank, other.rank, other.rep = self.rank, rank, rep
        return other

    def build(self) -> ProgramBuilder:
        b = ProgramBuilder(self.rank)
        cross = self._cross_deps()
        streams: dict[int, int] = {}
        end_node = _Ends(b)  # op index -> node that ends it
        rec_end: dict[int, int] = {}  # op index -> recorded end (ns)
        stream_last: dict[int, int] = {}  # dense stream -> last op index on it
        origin = min((op.ts for op in self.ops), default=0)  # a stream's first op keeps its offset from here
        step_of = self._step_index
        cur_step = None
        for i, op in enumerate(self.ops):
            st = streams.setdefault(op.stream, len(streams))
            k = step_of(op)
            if cur_step is not None and k != cur_step:
                self._step(b, stream_last, end_node)
            cur_step = k
            if st in stream_last:
                end_node.need(stream_last[st])  # the stream's next op follows its collective's end
            deps = [end_node[j] for j in cross.get(i, [])]
            ready = max([rec_end[j] for j in cross.get(i, [])] + [rec_end.get(stream_last.get(st, -1), origin)])
            gap = op.ts - ready
            if gap > 0 and self.gaps == "keep":
                b.compute("idle", gap, st, deps)
                deps = []
                self.rep.idle_ns += gap
            if self._is_comm(op):
                end_node.later(i, self._collective(b, op, st, deps), st)
            else:
                end_node[i] = b.compute(op.name, op.dur, st, deps)
                self.rep.kernels += 1
            rec_end[i] = op.ts + op.dur
            stream_last[st] = i
        self._step(b, stream_last, end_node)
        return b

    def _step_index(self, op: _Op) -> int:
        if not self.step_starts:
            return 0
        t = self.launch_ts.get(op.corr, op.ts)
        return max(0, bisect.bisect_right(self.step_starts, t) - 1)

    def _step(self, b: ProgramBuilder, stream_last: dict[int, int], end_node: _Ends) -> None:
        deps = sorted({end_node[i] for i in stream_last.values()})
        b.step(stream=STEP_STREAM, deps=deps)
        self.rep.steps += 1

    def _collective(self, b: ProgramBuilder, op: _Op, st: int, deps: list[int]) -> int:
        args = self._comm_args(op)
        kind = _kind(op.name, args)
        if kind is None:
            raise InputError(
                f"cannot tell which collective NCCL kernel {op.name!r} runs", file=self.src, field=f"{op.where}.args"
            )
        if "In msg nelems" not in args and "Out msg nelems" not in args:
            raise InputError(
                f"NCCL kernel {op.name!r} has no 'In msg nelems'/'Out msg nelems' (here or on its CPU op): "
                "its size cannot be inferred",
                file=self.src,
                field=f"{op.where}.args",
            )
        dtype = _dtype(args)
        nbytes = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0)) * DTYPE_BYTES[dtype]
        group = _ranks(args, self.world, self.src, op.where)
        if self.source_rank is not None and kind in ("send", "recv", "send_recv"):
            raise InputError(
                f"cannot replicate the trace of rank {self.source_rank}: point-to-point transfers (here "
                f"{op.name!r}) differ between ranks, so one rank's trace cannot stand for the others",
                file=self.src,
                field=f"{op.where}.args",
            )
        if kind in ("send", "recv", "send_recv"):
            key = "Dst Rank" if kind == "send" else "Src Rank"
            if kind == "send_recv" or not isinstance(args.get(key), int):
                raise InputError(f"a transfer needs args['{key}']", file=self.src, field=f"{op.where}.args")
            peer = group[args[key]] if args[key] < len(group) else args[key]
            pg = self.pgs.p2p_pg_of(self._pg_name(op), self.rank, int(peer), group)
            h = b.p2p(peer, kind == "send", nbytes, 0, None, st, deps, pg=pg)
            self.rep.transfers += 1
        else:
            root = None
            if kind in ("broadcast", "reduce"):
                root_rank = args.get("Root Rank", args.get("Src Rank", group[0]))
                root = group.index(root_rank) if root_rank in group else 0
            pg = self.pgs.pg_of(self._pg_name(op), group)
            if self.source_rank is not None:
                group = _spmd_group(group, self.source_rank, self.rank, self.world, self.src, op.where)
            if self.rank not in group:
                raise InputError(f"rank {self.rank} runs a collective on {list(group)}", file=self.src, field=op.where)
            h = b.collective(kind, group, nbytes, dtype, root, None, st, deps, redop=_redop(op.name, kind), pg=pg)
            self.rep.collectives += 1
        return h


class _Ends:
    """Op index -> the node that ends it; a collective's wait is added on its stream when first asked for."""

    def __init__(self, b: ProgramBuilder) -> None:
        self.b = b
        self.node: dict[int, int] = {}
        self.pending: dict[int, tuple[int, int]] = {}  # op index -> (collective node, stream)

    def __setitem__(self, i: int, node: int) -> None:
        self.node[i] = node

    def later(self, i: int, call: int, stream: int) -> None:
        self.pending[i] = (call, stream)

    def __getitem__(self, i: int) -> int:
        return self.need(i)

    def need(self, i: int) -> int:
        """The node ending op `i` (its collective's wait, added now if it is not yet)."""
        if i in self.pending:
            call, stream = self.pending.pop(i)
            self.node[i] = self.b.wait([call], stream)
        return self.node[i]


def _block(rank: int, stride: int, size: int) -> tuple[int, ...]:
    """The group of `size` ranks `stride` apart that holds `rank`, in the tiling such groups make of the world
    (stride 1: tensor-parallel blocks; stride = block size: data-parallel groups across them)."""
    base = rank // (stride * size) * (stride * size) + rank % stride
    return tuple(base + i * stride for i in range(size))


def _spmd_group(group: tuple[int, ...], source: int, rank: int, world: int, src: str, where: str) -> tuple[int, ...]:
    """`rank`'s counterpart of the group `source` used: the same size and stride, holding `rank`."""
    size = len(group)
    if sorted(group) == list(range(world)):
        return group
    stride = group[1] - group[0] if size > 1 else 1
    if stride < 1 or world % (stride * size) or group != _block(source, stride, size):
        raise InputError(
            f"cannot replicate a collective on ranks {list(group)} to other ranks: only groups of evenly spaced "
            f"ranks that tile the world of {world} (as tensor, data and pipeline groups do) can be mapped",
            file=src,
            field=f"{where}.args.Process Group Ranks",
        )
    return _block(rank, stride, size)


NOTES = [
    "kernel durations are kept as recorded; NCCL kernel durations are dropped and re-simulated",
    "host-side (CPU) time is not modelled beyond the idle gaps kept on each stream",
    "without cuda_sync events, the waits of compute streams on NCCL streams cannot be inferred",
    "memory copies are compute nodes of their recorded duration (not network flows)",
]


def import_kineto(
    paths: Sequence[str | Path], *, gaps: str = "keep", replicate_rank: int | None = None
) -> tuple[ExecGraph, KinetoReport]:
    """Traces of ranks 0..n-1 (rank from ``distributedInfo.rank`` when present, else file order) -> a graph.

    `replicate_rank` R: the trace of rank R alone stands for every rank of the world its
    ``distributedInfo.world_size`` records (SPMD); the other files are not read."""
    if gaps not in ("keep", "drop"):
        raise InputError(f"gaps must be 'keep' or 'drop', got {gaps!r}", field="gaps")
    if not paths:
        raise InputError("no trace files given", field="traces")
    if replicate_rank is not None:
        return _import_replicated(paths, gaps, replicate_rank)
    objs = [(str(p), read_trace(p)) for p in paths]
    infos = [o.get("distributedInfo") or {} for _, o in objs]
    world = int(infos[0].get("world_size") or len(objs))
    ranks = [int(info["rank"]) if "rank" in info else i for i, info in enumerate(infos)]
    if sorted(ranks) != list(range(len(objs))) or world != len(objs):
        hint = f" (or replicate one of them, assuming SPMD: --replicate-rank {ranks[0]})" if len(objs) < world else ""
        raise InputError(
            f"need one trace per rank of the world ({world}); got ranks {sorted(ranks)}{hint}",
            file=objs[0][0],
            field="distributedInfo",
        )
    rep = KinetoReport(ranks=world)
    pgs = PgTable()
    imports: list[_RankImport | None] = [None] * world
    for (src, obj), info, r in zip(objs, infos, ranks, strict=True):
        pgs.add_config(info, src)
        imports[r] = _RankImport(obj, src, r, world, gaps, rep)
    for imp in imports:
        if imp is not None:
            imp.note_groups(pgs)
    builders = [imp.build() for imp in imports if imp is not None]
    rep.notes = list(NOTES)
    meta = {"source": "kineto", "files": [s for s, _ in objs], "gaps": gaps}
    graph = build_graph(builders, meta=meta)
    return graph, rep


def _distributed_rank(path: str | Path, index: int) -> tuple[dict[str, Any], int]:
    obj = read_trace(path)
    info = obj.get("distributedInfo") or {}
    return obj, int(info["rank"]) if "rank" in info else index


def _import_replicated(paths: Sequence[str | Path], gaps: str, rank: int) -> tuple[ExecGraph, KinetoReport]:
    """SPMD: the trace of `rank` stands for every rank of its world."""
    found = None
    seen = []
    for i, p in enumerate(paths):
        obj, r = _distributed_rank(p, i)
        seen.append(r)
        if r == rank:
            found = (str(p), obj)
            break
    if found is None:
        raise InputError(f"no trace of rank {rank} to replicate (ranks here: {seen})", file=str(paths[0]))
    src, obj = found
    world = (obj.get("distributedInfo") or {}).get("world_size")
    if not isinstance(world, int) or world < 1:
        raise InputError(
            "replicating a rank needs the world size the trace records (distributedInfo.world_size)",
            file=src,
            field="distributedInfo.world_size",
        )
    if not 0 <= rank < world:
        raise InputError(f"rank {rank} is outside the recorded world of {world}", file=src, field="distributedInfo")
    rep = KinetoReport(ranks=world, replicated_from=rank)
    traced = _RankImport(obj, src, rank, world, gaps, rep)
    pgs = PgTable()
    pgs.add_config(obj.get("distributedInfo") or {}, src)
    traced.note_groups(pgs)
    builders = [traced.as_rank(r, rep if r == rank else KinetoReport()).build() for r in range(world)]
    rep.notes = [
        f"SPMD assumption: the trace of rank {rank} stands for all {world} ranks (distributedInfo.world_size): "
        "every rank runs its kernels with their recorded durations and the same collectives, each in its own "
        "group of the same size and stride",
        *NOTES,
    ]
    meta = {"source": "kineto", "files": [src], "gaps": gaps, "replicated_from": rank}
    return build_graph(builders, meta=meta), rep


def trace_files(path: str | Path) -> list[Path]:
    """A trace file, or every *.json / *.json.gz file of a directory, in name order."""
    p = Path(path)
    if p.is_dir():
        files = sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
        if not files:
            raise InputError("no *.json or *.json.gz trace files here", file=str(p))
        return files
    return [p]


def looks_like_kineto(path: str | Path) -> bool:
    """True for a Chrome-trace file (or a directory of them): checks the first bytes for 'traceEvents'."""
    p = Path(path)
    try:
        files = trace_files(p) if p.is_dir() else [p]
        head = gzip.open(files[0]).read(4096) if files[0].suffix == ".gz" else files[0].open("rb").read(4096)
    except (OSError, InputError):
        return False
    return b"traceEvents" in head
