"""Re-target a data-parallel (DDP or FSDP, possibly times a model-parallel block) graph to a larger world.

The recorded world of n ranks is read as d data-parallel replicas of m model-parallel ranks, with
rank = dp_index * m + mp_index (data parallelism outermost, as torchrun with a DeviceMesh or Megatron
lay ranks out). `scale_dp(graph, N)` builds the graph of N = k * n ranks: d * k replicas, each new
rank running the program of the rank with the same mp_index in replica (dp_index mod d). Its groups:
- the whole world -> the whole new world;
- a group inside one replica (TP, pipeline pairs) -> the same group in the new rank's replica;
- a data-parallel group (one rank per replica, same mp_index) -> the d * k ranks of that mp_index.
Anything else cannot be re-targeted by these rules and is an InputError naming the group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from phantora.egraph.format import P2P, Coll, Compute, ExecGraph, Program, RankEntry, Step, Wait
from phantora.errors import InputError
from phantora.rank_options import DEFAULT_LAUNCH_NS


@dataclass
class ScaleReport:
    """What the re-targeting did and what the prediction assumes."""

    parallelism: str
    old_world: int
    new_world: int
    dp_old: int
    dp_new: int
    mp: int
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def lines(self) -> list[str]:
        head = (
            f"re-targeted {self.parallelism}: {self.old_world} -> {self.new_world} ranks "
            f"(data-parallel {self.dp_old} -> {self.dp_new}, model-parallel block {self.mp})"
        )
        return [head, "assumptions:", *(f"  - {a}" for a in self.assumptions)]


def _classify(g: tuple[int, ...], n: int, m: int) -> str | None:
    """'world', 'block' or 'dp' for a group under a layout with model-parallel size m, else None."""
    d = n // m
    if sorted(g) == list(range(n)):
        return "world"
    if len({r // m for r in g}) == 1:
        return "block"
    if len(g) == d and len({r % m for r in g}) == 1 and sorted(r // m for r in g) == list(range(d)):
        return "dp"
    return None


def find_layout(graph: ExecGraph) -> int:
    """The smallest model-parallel size m under which every group is world, in-block or data-parallel."""
    n = graph.world
    for m in range(1, n + 1):
        if n % m == 0 and all(_classify(g, n, m) is not None for g in graph.groups):
            if m == n and n > 1:
                break  # one replica: nothing is data-parallel
            return m
    for g in graph.groups:
        if _classify(g, n, 1) is None:
            raise InputError(
                f"group {list(g)[:16]} is neither the world, nor inside a model-parallel block, nor a data-parallel "
                "group for any block size: this graph cannot be re-targeted by --scale-dp",
                field="groups",
            )
    raise InputError("this graph has no data-parallel dimension to scale", field="groups")


def _parallelism(graph: ExecGraph, m: int) -> str:
    n = graph.world
    kinds: set[str] = set()
    for e in graph.ranks:
        prog = graph.programs[e.program]
        for node in prog.nodes:
            if isinstance(node, Coll) and _classify(graph.groups[e.groups[node.slot]], n, m) in ("world", "dp"):
                kinds.add(node.kind)
    name = "fsdp" if "reduce_scatter" in kinds else "ddp"  # FSDP reduce-scatters gradients; DDP all-reduces them
    return name if m == 1 else f"{name} x model-parallel {m}"


def scale_dp(graph: ExecGraph, new_world: int) -> tuple[ExecGraph, ScaleReport]:
    """The graph re-targeted to `new_world` ranks (a multiple of the recorded world), and its report."""
    n = graph.world
    if new_world < n or new_world % n:
        raise InputError(
            f"--scale-dp {new_world}: the new world must be a multiple of the recorded world ({n})", field="scale-dp"
        )
    m = find_layout(graph)
    _check_transfers(graph, m)
    d, k = n // m, new_world // n
    world = tuple(range(new_world))
    groups: list[tuple[int, ...]] = []
    index: dict[tuple[int, ...], int] = {}

    def gid(g: tuple[int, ...]) -> int:
        if g not in index:
            index[g] = len(groups)
            groups.append(g)
        return index[g]

    ranks = []
    for r2 in range(new_world):
        j2, i = divmod(r2, m)
        src = (j2 % d) * m + i
        e = graph.ranks[src]
        bound = []
        for gi in e.groups:
            g = graph.groups[gi]
            cls = _classify(g, n, m)
            if cls == "world":
                bound.append(gid(world))
            elif cls == "block":
                shift = (j2 - src // m) * m
                bound.append(gid(tuple(x + shift for x in g)))
            else:
                bound.append(gid(tuple(i + jj * m for jj in range(d * k))))
        ranks.append(RankEntry(e.program, tuple(bound)))
    report = ScaleReport(_parallelism(graph, m), n, new_world, d, d * k, m, _assumptions(graph, m, k))
    meta = dict(graph.meta)
    meta["scaled"] = report.to_dict()
    programs = graph.programs
    if "fsdp" in report.parallelism and k > 1:
        run = graph.meta.get("run") or {}
        launch = int(run.get("launch_ns") or DEFAULT_LAUNCH_NS)
        floors = kernel_floors(run)
        programs = [shrink_optimizer_step(p, k, launch, floors) for p in programs]
    out = ExecGraph(new_world, groups, programs, ranks, meta, {})
    out.check("<scaled graph>")
    return out, report


def kernel_floors(run: dict[str, Any]) -> dict[str, float]:
    """Per op class, the shortest time a kernel takes however small its input (the calibrated
    compute model's floor; none for the roofline model), for the run the graph was recorded with."""
    if run.get("compute_model", "calibrated") != "calibrated":
        return {}
    from phantora.perfmodel.model import load_curves

    params = load_curves(run.get("curves")).params
    floors = {cls: float(p["floor_ns"]) for cls, p in params.items() if p.get("floor_ns") is not None}
    floors.setdefault("attention_fwd", floors.get("gemm", 0.0))  # flash kernels: the GEMM floor
    floors.setdefault("attention_bwd", floors.get("gemm", 0.0))
    return floors


def shrink_optimizer_step(prog: Program, k: int, launch_ns: int, floors: dict[str, float] | None = None) -> Program:
    """FSDP: the compute after each step's last reduce-scatter wait (the optimizer step on the
    gradient shards) works on shards k times smaller: each kernel keeps its launch overhead and its
    floor (`kernel_floors`, by op class: a tiny kernel costs its floor at any size) and 1/k of the rest."""
    from phantora.perfmodel.ops import op_class

    floors = floors or {}
    floor_of: dict[str, int] = {}
    rs = {i for i, node in enumerate(prog.nodes) if isinstance(node, Coll) and node.kind == "reduce_scatter"}
    out = list(prog.nodes)
    segment_start = 0
    for i, node in enumerate(prog.nodes):
        if isinstance(node, Wait) and rs.intersection(node.refs):
            segment_start = i + 1
        elif isinstance(node, Step):
            for j in range(segment_start, i):
                c = out[j]
                if isinstance(c, Compute) and c.dur_ns > launch_ns:
                    if c.name not in floor_of:
                        floor_of[c.name] = int(floors.get(op_class(c.name), 0.0))
                    kept = launch_ns + min(floor_of[c.name], c.dur_ns - launch_ns)
                    out[j] = dataclasses.replace(c, dur_ns=kept + -(-(c.dur_ns - kept) // k))
            segment_start = i + 1
    return Program(out)


def _check_transfers(graph: ExecGraph, m: int) -> None:
    """Point-to-point transfers must stay inside a model-parallel block (pipeline stages, not across replicas)."""
    for r, e in enumerate(graph.ranks):
        for node in graph.programs[e.program].nodes:
            if isinstance(node, P2P):
                g = graph.groups[e.groups[node.slot]]
                if g[0] // m != g[1] // m:
                    raise InputError(
                        f"rank {r} sends between data-parallel replicas ({g[0]} -> {g[1]}, block size {m}): "
                        "--scale-dp cannot re-target that",
                        field="groups",
                    )


def _assumptions(graph: ExecGraph, m: int, k: int) -> list[str]:
    out = [
        "weak scaling: every rank keeps its recorded micro-batch, so compute durations are kept as recorded "
        f"(the global batch grows {k}x)",
        "rank layout: data parallelism is the outermost dimension (rank = dp_index * model_parallel + mp_index)",
        "data-parallel collectives keep their byte counts (nccl-tests convention: the all-reduce buffer is the full "
        "gradient, the all-gather output and reduce-scatter input are the full unsharded parameters); their groups "
        f"grow {k}x",
        "the recorded step times no longer apply; collective algorithms and channels are chosen anew for the new "
        "group sizes",
    ]
    if "fsdp" in _parallelism(graph, m):
        out.append(
            f"FSDP: the optimizer step (the compute after each step's last reduce-scatter wait) works on shards {k}x "
            "smaller: each of its kernels keeps its launch overhead and floor and 1/k of the rest; other per-shard "
            "work (gradient copies inside the backward) is kept as recorded; padding of flat parameters is ignored"
        )
    if m > 1:
        out.append(f"groups inside a model-parallel block of {m} ranks are copied to each new replica")
    return out
