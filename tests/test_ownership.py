"""One owner per decision (docs/architecture.md, issue 35): the engine is built by one factory from one
`EngineSpec`, and the run directory's files are named and written by `phantora/results/` only.

Like tests/test_layering.py, these read the source (every module of phantora/ and bridge/) with `ast`, so a
second engine factory or a second writer of run-directory files fails here, whoever adds it.
"""

from __future__ import annotations

import ast
import functools
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACTORY = "phantora/netsim/factory.py"


@functools.cache
def modules() -> tuple[tuple[str, ast.Module], ...]:
    """Every module of phantora/ and bridge/ and its syntax tree, parsed once for all the checks (they only read it).

    The cyclic GC is off meanwhile: a syntax tree holds no cycle, and its collections, each walking the trees kept
    so far, were most of the parse (3.6 of 4.3 CPU s in a fresh interpreter)."""
    paths = [path for top in ("phantora", "bridge") for path in sorted((ROOT / top).rglob("*.py"))]
    was_on = gc.isenabled()
    gc.disable()
    try:
        return tuple((str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))) for path in paths)
    finally:
        if was_on:
            gc.enable()


@functools.cache
def walked() -> tuple[tuple[str, tuple[ast.AST, ...]], ...]:
    """Every module's nodes in `ast.walk` order, walked once: walking the packages' trees again for each check cost
    about as much as the check."""
    return tuple((name, tuple(ast.walk(tree))) for name, tree in modules())


@pytest.fixture(scope="module", autouse=True)
def trees_dropped_after_the_file() -> Iterator[None]:
    """The trees (570,000 nodes) are dropped when this file is done: kept for the rest of the worker's session, every
    full collection of a later test walked them too (tests/test_replay_gc_freeze.py's gc.collect test, 0.2 s alone,
    took 6 s after this file in one process)."""
    yield
    walked.cache_clear()
    modules.cache_clear()


def engine_classes() -> set[str]:
    """Every class of phantora/netsim/ that is an engine: its name ends in Simulator (the NetworkSimulator
    protocol's implementers and wrappers), found by reading the package, not listed by hand; and the batch form
    of the packet engine, RunnerNetwork (phantora-ns3-runner)."""
    names = {"RunnerNetwork"}
    for name, tree in modules():  # the package's own modules, not its subpackages'
        if not name.startswith("phantora/netsim/") or "/" in name.removeprefix("phantora/netsim/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Simulator") and node.name != "NetworkSimulator":
                names.add(node.name)
    return names


def called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_engine_classes_are_found() -> None:
    """The finder sees the engines it must (else the next test would pass vacuously)."""
    assert {"FlowSimulator", "Ns3Simulator", "DecomposedSimulator", "FluidNvlinkSimulator"} <= engine_classes()
    assert "NetworkSimulator" not in engine_classes()  # the protocol itself is no engine


def test_only_the_factory_builds_engines() -> None:
    """No module but phantora/netsim/factory.py instantiates an engine class; `make_engine` is defined once."""
    engines = engine_classes()
    built, factories = [], []
    for name, nodes in walked():
        for node in nodes:
            if isinstance(node, ast.Call) and called_name(node) in engines and name != FACTORY:
                built.append(f"{name}:{node.lineno} {called_name(node)}(...)")
            if isinstance(node, ast.FunctionDef) and node.name == "make_engine":
                factories.append(name)
    assert built == [], "engines are built by phantora.netsim.factory.make_engine(EngineSpec, topo) only"
    assert factories == [FACTORY]


def test_engine_settings_have_one_home() -> None:
    """NETWORKS, the window's default and the flow engine's --set fields are defined in engine_spec.py only."""
    owner = "phantora/netsim/engine_spec.py"
    defined = []
    for name, nodes in walked():
        for node in nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in ("NETWORKS", "DEFAULT_WINDOW_NS", "FLOW_FIELDS"):
                        defined.append((t.id, name))
    assert sorted(defined) == [("DEFAULT_WINDOW_NS", owner), ("FLOW_FIELDS", owner), ("NETWORKS", owner)]


def run_dir_names() -> tuple[set[str], set[str]]:
    """The run directory's file and folder names (what `RunDir` owns), and the schema constants holding them."""
    from phantora.results import schema
    from phantora.results.run_dir import OUTPUT_DIRS, OUTPUT_FILES

    names = set(OUTPUT_FILES) | set(OUTPUT_DIRS)
    constants = {k for k, v in vars(schema).items() if k.isupper() and isinstance(v, str) and v in names}
    return names, constants


def joins_a_run_dir_name(node: ast.AST, names: set[str], constants: set[str]) -> bool:
    """`x / "results.json"`, `x / S.RESULTS_JSON`, `x / STEPS_DIR`: a run-directory path built by hand."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
        return False
    right = node.right
    if isinstance(right, ast.Constant) and right.value in names:
        return True
    if isinstance(right, ast.Attribute) and right.attr in constants:
        return True
    return isinstance(right, ast.Name) and right.id in constants


NOT_RUN_DIRS = {"examples_dir() / 'jobs'"}  # the shipped job specs (examples/jobs/), a folder of another kind


def test_only_results_builds_run_directory_paths() -> None:
    """Outside phantora/results/, nobody joins a directory with a run-directory file or folder name (by literal or
    by schema constant), nor imports those names bare: paths come from `RunDir` (`file`, `log`, `job`, ...)."""
    names, constants = run_dir_names()
    assert {"RESULTS_JSON", "TRACE_JSON", "COSIM_JSON", "STEPS_DIR", "LOGS_DIR"} <= constants
    found = []
    for name, nodes in walked():
        if name.startswith("phantora/results/"):
            continue
        for node in nodes:
            if joins_a_run_dir_name(node, names, constants) and ast.unparse(node) not in NOT_RUN_DIRS:
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and node.module == "phantora.results.schema":
                found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name in constants]
    assert found == [], "run-directory paths come from phantora.results.run_dir.RunDir"


def test_the_path_check_catches_a_hand_built_path() -> None:
    """The checker itself: it flags the three ways of building a path by hand, and not RunDir's own calls."""
    names, constants = run_dir_names()
    flagged = [
        joins_a_run_dir_name(ast.parse(src, mode="eval").body, names, constants)
        for src in ('out / "results.json"', "out / S.COSIM_JSON", "out / STEPS_DIR", "rd.file(S.RESULTS_JSON)")
    ]
    assert flagged == [True, True, True, False]


def test_the_fabric_defaults_have_one_home() -> None:
    """What a fabric-scaled default resolves to (a switch's buffer from its fastest port, 16 * bw / 50 MiB; ECN kmin
    and kmax, 4000 and 16000 bytes per Gb/s) is the C++ model's to compute and report (`EffectiveParams`,
    engine.json); no Python module computes it again: no expression holds those rules' constants, and the old
    helpers (PacketConfig.scaled_buffer, scaled_kmin, scaled_kmax) stay gone."""
    found = []
    for name, nodes in walked():
        for node in nodes:
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (16000, 50_000_000_000):
                found.append(f"{name}:{node.lineno} {node.value}")
            if isinstance(node, ast.FunctionDef) and node.name in ("scaled_buffer", "scaled_kmin", "scaled_kmax"):
                found.append(f"{name}:{node.lineno} def {node.name}")
    assert found == [], "the fabric's defaults are resolved in ns-3 and read back (phantora.netsim.effective)"


RUN_DIR_PATHS = ("file", "merge_trace", "merge_steps")  # RunDir's calls that return a run-directory path


def reads_run_files(tree: ast.AST) -> list[ast.Call]:
    """`rd.file(S.X).read_text()`, and `p.read_text()` / `p.read_bytes()` / `p.open()` (for reading) where `p` was
    bound in the same function from `rd.file(...)` or `rd.merge_trace(...)`: a run-directory file read by hand."""

    def path_call(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RUN_DIR_PATHS

    found = []
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))]:
        bound = {
            t.id
            for n in ast.walk(func)
            if isinstance(n, ast.Assign) and path_call(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in ast.walk(func):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
                continue
            reading = n.func.attr in ("read_text", "read_bytes") or (
                n.func.attr == "open"
                and all(isinstance(a, ast.Constant) and str(a.value).startswith("r") for a in n.args[:1])
            )
            receiver = n.func.value
            if reading and (path_call(receiver) or (isinstance(receiver, ast.Name) and receiver.id in bound)):
                found.append(n)
    return list({id(n): n for n in found}.values())  # a call inside a function is also inside its module


def test_only_results_reads_run_directory_files() -> None:
    """Outside phantora/results/, nobody reads a run-directory file by hand: `phantora.results.read` does
    (`read_document`, `read_results`, `read_steps`, `load_run`)."""
    found = []
    for name, tree in modules():
        if not name.startswith("phantora/results/"):
            found += sorted({f"{name}:{c.lineno} {ast.unparse(c)}" for c in reads_run_files(tree)})
    assert found == [], "run-directory files are read by phantora.results.read"


def test_the_reader_check_catches_a_hand_read_file() -> None:
    """The checker itself: a file read through RunDir's paths is flagged, a write and another path are not."""
    sources = [
        "json.loads(RunDir(out).file(S.SWEEP_RUN_JSON).read_text())",
        "def f(rd):\n    p = rd.merge_trace()\n    return p.read_text()",
        "def f(rd):\n    p = rd.file(S.RUN_LOG)\n    return p.open('w')",
        "Path(spec).read_text()",
    ]
    assert [len(reads_run_files(ast.parse(src))) for src in sources] == [1, 1, 0, 0]


ENGINE_FLAGS = {"network", "cc", "packet_set", "sets", "queue_sample_ns", "seed", "window_ns", "scenario"}


def engine_carriers() -> dict[str, set[str]]:
    """Every class of phantora/ and bridge/ with a field typed `EngineSpec` -> its other field names."""
    out = {}
    for name, nodes in walked():
        for node in nodes:
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {s.target.id: ast.unparse(s.annotation) for s in node.body if isinstance(s, ast.AnnAssign)
                      and isinstance(s.target, ast.Name)}  # fmt: skip
            if "EngineSpec" in fields.values():
                out[f"{name}:{node.name}"] = {f for f, t in fields.items() if t != "EngineSpec"}
    return out


def test_a_carrier_of_the_engine_spec_holds_no_engine_option_beside_it() -> None:
    """The run's engine travels as one object (RunConfig.engine, RunSpec.engine, ...): a class holding an EngineSpec
    holds none of the engine's options beside it (no second `window_ns` or `packet_set` to drift from it)."""
    carriers = engine_carriers()
    assert {"phantora/launcher.py:RunConfig", "bridge/runspec.py:RunSpec"} <= set(carriers)  # not vacuous
    beside = {where: sorted(names & ENGINE_FLAGS) for where, names in carriers.items() if names & ENGINE_FLAGS}
    assert beside == {}
