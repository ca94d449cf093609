"""`after_import(module, fn)`: run `fn(module)` once the module is imported, or now if it already is.

Patches of optional parts of torch (FSDP2's storage helpers) wait for the script to import them,
so a rank that never uses them does not pay their import (about 0.5 s of CPU per rank for FSDP2).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so the callbacks run right after its body."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            for fn in _PENDING.pop(name, []):
                fn(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _Finder()


def after_import(module: str, fn: Callable[[ModuleType], None]) -> None:
    """Call `fn(module object)` when `module` has been imported (at once if it already has)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        fn(loaded)
        return
    _PENDING.setdefault(module, []).append(fn)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
