"""The packages import one way, in layers, and no module imports itself back through others.

Every import statement of `phantora/` and `bridge/` counts, including imports inside functions and under
`TYPE_CHECKING`: a lazy import is still a dependency. The layers, lowest first, are the ones that
docs/architecture.md draws ("Layers"); a module may import its own layer and the layers below. On top:
from `bridge`, the rank runtime may use only `bridge.client`.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "phantora.errors",
            "phantora.files",
            "phantora.units",
            "phantora.paths",
            "phantora.procmem",
            "phantora.resources",
            "phantora.progress",
            "phantora.lazy_exports",
            "phantora.cached_build",
        ),
    ),
    ("models", ("phantora.topology", "phantora.perfmodel", "phantora.netsim", "phantora.collectives")),
    (
        "workloads",
        (
            "phantora.workload",
            "phantora.replay",
            "phantora.replay_ranks",
            "phantora.p2p_knowledge",
            "phantora.replay_groups",
            "phantora.plan_split",
            "phantora.jobs.spec",
            "phantora.rank_options",
            "phantora.spawn_count",
            "phantora.run_gpu",
        ),
    ),
    ("results", ("phantora.results", "phantora.jobs.results", "phantora.jobs.scenario")),
    ("bridge", ("bridge",)),
    ("runtime", ("phantora.runtime",)),
    ("launch", ("phantora.launcher",)),
    ("analysis", ("phantora.egraph", "phantora.report", "phantora.jobs.recorded", "phantora.jobs.run")),
    ("sweeps", ("phantora.sweep", "phantora.sweep_local", "phantora.sweep_ray")),
    ("entry", ("phantora.commands", "phantora.cli", "phantora")),  # phantora.jobs (its __init__) holds no code
]
RUNTIME_MAY_USE_FROM_BRIDGE = {"bridge.client"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of phantora/ and bridge/."""
    out = {}
    for pkg in ("phantora", "bridge"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The project modules an import statement loads (the longest known prefix of each name)."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, with the line of the first such import: a copy of the graph read once for the
    file's checks (reading every module again for each of the five cost about as much as the check), which the
    caller may change."""
    return _read_import_graph().copy()


@functools.cache
def _read_import_graph() -> nx.DiGraph:
    known = module_files()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, path, node, known):
                    if not g.has_edge(name, target):
                        g.add_edge(name, target, line=node.lineno)
    return g


def layer_of(module: str) -> int:
    """Index of the layer holding `module` (the longest matching prefix wins)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    return best


def wrong_way_imports(g: nx.DiGraph) -> list[str]:
    bad = []
    for a, b, data in g.edges(data=True):
        where = f"{a} (line {data['line']}) imports {b}"
        if layer_of(b) > layer_of(a):
            bad.append(f"{where}: {LAYERS[layer_of(a)][0]} may not use {LAYERS[layer_of(b)][0]}")
        if a.startswith("phantora.runtime") and b.startswith("bridge") and b not in RUNTIME_MAY_USE_FROM_BRIDGE:
            bad.append(f"{where}: the runtime may use only {sorted(RUNTIME_MAY_USE_FROM_BRIDGE)} of the bridge")
    return sorted(bad)


def test_every_module_is_in_a_layer_and_imports_only_downwards() -> None:
    g = import_graph()
    assert g.number_of_nodes() > 100 and g.number_of_edges() > 300  # the scan sees the project
    assert wrong_way_imports(g) == []


def test_no_import_cycles() -> None:
    cycles = [" -> ".join([*c, c[0]]) for c in nx.simple_cycles(import_graph())]
    assert cycles == []


SUPERVISORS = ("phantora.launcher", "phantora.jobs.run", "bridge.run", "bridge.jobs")  # start and watch ranks


def test_the_launcher_imports_no_rank_side_code() -> None:
    """The launcher (and the jobs runner, and the bridge's run) supervise ranks; what they share with them (their
    options) lives below both: no supervisor imports phantora.runtime, directly or through another supervisor."""
    g = import_graph()
    assert set(SUPERVISORS) <= set(g.nodes)
    rank_side = [f"{a} -> {b}" for a in SUPERVISORS for b in nx.descendants(g, a) if b.startswith("phantora.runtime")]
    assert rank_side == []


def test_the_bridge_only_bridges() -> None:
    """Engines live in netsim/ (decomposition gets its worker spawner from the bridge), replay processes in egraph/."""
    modules = module_files()
    assert "bridge.decompose" not in modules and "bridge.replay_rank" not in modules
    assert {"phantora.netsim.decompose", "phantora.egraph.replay_rank"} <= set(modules)
    g = import_graph()
    assert not [b for b in g.successors("phantora.netsim.decompose") if b.startswith("bridge")]


def test_one_gpu_spec() -> None:
    """One GpuSpec class (phantora.perfmodel.gpus), which every layer reads."""
    defined = [
        name
        for name, path in module_files().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "GpuSpec"
    ]
    assert defined == ["phantora.perfmodel.gpus"]


def test_ns3_model_includes_only_model_and_ns3_headers() -> None:
    """ns-3's direction is model -> helper: a file of ns3-scratch/model/ includes its own folder's headers and ns-3's
    ("ns3/..."), never a helper's (nor a runner's or a test's)."""
    model = ROOT / "ns3-scratch" / "model"
    own = {p.name for p in model.iterdir()}
    bad = [
        f'model/{f.name}: #include "{inc}"'
        for f in sorted(model.glob("*.[ch]*"))
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(), flags=re.M)
        if not inc.startswith("ns3/") and inc not in own or "helper" in inc
    ]
    assert len(own) > 20 and bad == []


def test_the_check_catches_a_wrong_way_import_and_a_cycle() -> None:
    g = import_graph()
    g.add_edge("bridge.netserver", "phantora.report.compare", line=1)  # the kind of import this test forbids
    g.add_edge("phantora.runtime.session", "bridge.run", line=1)
    g.add_edge("phantora.netsim.base", "phantora.netsim.flow", line=1)  # flow imports base: a cycle
    bad = wrong_way_imports(g)
    assert any("bridge.netserver" in b and "analysis" in b for b in bad)
    assert any("runtime may use only" in b and "bridge.run" in b for b in bad)
    assert any({"phantora.netsim.base", "phantora.netsim.flow"} == set(c) for c in nx.simple_cycles(g))
