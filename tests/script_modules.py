"""Load a repository script (scripts/, bench/) as a module for its tests: `load("scripts/doc_figures.py")`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(relpath: str) -> ModuleType:
    """The script at ROOT / relpath, run once and registered under its stem (dataclasses look their module up)."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
