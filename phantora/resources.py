"""Where phantora's shipped data lives: topologies, workloads and the ns-3 model sources; and the user cache.

A git checkout (an editable install, or PYTHONPATH) uses the repository's own `topologies/`, `workloads/`
and `ns3-scratch/`, so edits are seen at once. An installed package (`pip install .`, a wheel) carries copies
of them as package data in `phantora/_data/`, put there at build time by the hook in `setup.py`.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from phantora.errors import PhantoraError

# The folders shipped in phantora/_data (setup.py copies them); the ns-3 sources are these parts of ns3-scratch/.
SHIPPED_DIRS = ("topologies", "workloads", "examples")
NS3_SOURCES = ("Makefile", "model", "runner", "test")


def checkout_root() -> Path | None:
    """The git checkout this package runs from (it has pyproject.toml and ns3-scratch/ beside phantora/), else None."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "ns3-scratch" / "Makefile").is_file():
        return root
    return None


def data_root() -> Path:
    """The folder holding topologies/, workloads/ and ns3-scratch/: the checkout, else phantora/_data."""
    root = checkout_root()
    if root is not None:
        return root
    package = importlib.resources.files("phantora")
    if not isinstance(package, Path):
        raise PhantoraError(f"phantora must be installed as files on disk, not in an archive ({package})")
    return package / "_data"


def topologies_dir() -> Path:
    """The shipped topologies: $PHANTORA_TOPOLOGIES, else <data root>/topologies."""
    env = os.environ.get("PHANTORA_TOPOLOGIES")
    return Path(env) if env else data_root() / "topologies"


def workloads_dir() -> Path:
    """The shipped workloads and HPCC flow files (e.g. incast4.flows.txt)."""
    return data_root() / "workloads"


def examples_dir() -> Path:
    """The shipped example training scripts (gpt_ddp.py, llama_train.py, ...)."""
    return data_root() / "examples"


def shipped_file(path: str | Path, folder: Path, suffixes: tuple[str, ...] = ()) -> Path:
    """`path` if it exists, else the shipped file of that name in `folder` (also tried with each suffix), else
    `path` unchanged (so the caller's "no such file" error names what the user typed)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    for name in (p.name, *(p.name + s for s in suffixes)):
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return p


def ns3_source_dir() -> Path:
    """The ns-3 model sources (Makefile, model/, runner/, test/): ns3-scratch/ of the data root."""
    return data_root() / "ns3-scratch"


def cache_dir() -> Path:
    """The per-user cache of built artefacts: $PHANTORA_CACHE, else $XDG_CACHE_HOME/phantora (~/.cache/phantora)."""
    env = os.environ.get("PHANTORA_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phantora"
