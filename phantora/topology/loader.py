"""`load_topology`: one entry point for a file path (TOML, HPCC, SimAI) or a shipped topology name."""

from __future__ import annotations

from pathlib import Path

from phantora import resources
from phantora.errors import InputError
from phantora.topology.model import Topology
from phantora.topology.readers import read_hpcc, read_simai, sniff_format
from phantora.topology.tomlfile import read_toml

FORMATS = ("toml", "hpcc", "simai")
_READERS = {"toml": read_toml, "hpcc": read_hpcc, "simai": read_simai}


def shipped_dir() -> Path:
    """The directory of shipped topologies (phantora.resources.topologies_dir)."""
    return resources.topologies_dir()


def shipped_names() -> list[str]:
    """Names accepted by `load_topology` for the shipped files (e.g. 'testbed16', 'hpcc/star8')."""
    root = shipped_dir()
    if not root.is_dir():
        return []
    names = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in (".toml", ".txt") and p.name != "README.md":
            rel = p.relative_to(root)
            names.append(
                str(rel.parent / rel.name.split(".")[0]) if rel.parent != Path(".") else rel.name.split(".")[0]
            )
    return names


def find_topology(spec: str | Path) -> Path:
    """Resolve a path or a shipped name to a file ('testbed16' -> topologies/testbed16.toml)."""
    path = Path(spec)
    if path.is_file():
        return path
    root = shipped_dir()
    for cand in (root / path, root / f"{spec}.toml"):
        if cand.is_file():
            return cand
    folder = root / path.parent
    if folder.is_dir():
        matches = sorted(p for p in folder.iterdir() if p.is_file() and p.name.split(".")[0] == path.name)
        if matches:
            return matches[0]
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):  # e.g. 'star8' -> hpcc/star8.topo.txt
            matches = sorted(p for p in sub.iterdir() if p.is_file() and p.name.split(".")[0] == path.name)
            if matches:
                return matches[0]
    known = ", ".join(shipped_names()) or "none"
    raise InputError(f"no such file, and not a shipped topology (shipped: {known})", file=str(spec))


def load_topology(spec: str | Path, fmt: str | None = None) -> Topology:
    """Load a topology from a file path or a shipped name; fmt forces 'toml', 'hpcc' or 'simai'."""
    path = find_topology(spec)
    if fmt is None:
        fmt = sniff_format(path)
    if fmt not in _READERS:
        raise InputError(f"unknown topology format {fmt!r} (known: {', '.join(FORMATS)})", field="format")
    return _READERS[fmt](path)
