"""One owner per decision (docs/architecture.md, issue 35): the engine is built by one factory from one
`EngineSpec`, and the run directory's files are named and written by `phantora/results/` only.

Like tests/test_layering.py, these read the source (every module of phantora/ and bridge/) with `ast`, so a
second engine factory or a second writer of run-directory files fails here, whoever adds it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTORY = "phantora/netsim/factory.py"


def modules() -> Iterator[tuple[str, ast.Module]]:
    for top in ("phantora", "bridge"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def engine_classes() -> set[str]:
    """Every class of phantora/netsim/ that is an engine: its name ends in Simulator (the NetworkSimulator
    protocol's implementers and wrappers), found by reading the package, not listed by hand."""
    names = set()
    for path in (ROOT / "phantora" / "netsim").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Simulator") and node.name != "NetworkSimulator":
                names.add(node.name)
    return names


def called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_engine_classes_are_found() -> None:
    """The finder sees the engines it must (else the next test would pass vacuously)."""
    assert {"FlowSimulator", "Ns3Simulator", "DecomposedSimulator", "FluidNvlinkSimulator"} <= engine_classes()


def test_only_the_factory_builds_engines() -> None:
    """No module but phantora/netsim/factory.py instantiates an engine class; `make_engine` is defined once."""
    engines = engine_classes()
    built, factories = [], []
    for name, tree in modules():
        for node in ast.walk(tree):
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
    for name, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in ("NETWORKS", "DEFAULT_WINDOW_NS", "FLOW_FIELDS"):
                        defined.append((t.id, name))
    assert sorted(defined) == [("DEFAULT_WINDOW_NS", owner), ("FLOW_FIELDS", owner), ("NETWORKS", owner)]
