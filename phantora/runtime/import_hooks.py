"""Patch a module when the program first imports it, so that heavy modules a program may never use
are not imported by phantora (`torch.distributed.pipelining` alone takes about 2 s)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a watched module so the patches run after it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Patching(spec.loader, _pending.pop(fullname))
                return spec
            if spec is not None:
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, inner: Any, patches: list[Callable[[ModuleType], None]]) -> None:
        self.inner, self.patches = inner, patches

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for patch in self.patches:
            patch(module)


_finder = _AfterImport()


def after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Call `patch(module)` once module `name` is imported: now if it already is, else right after."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _pending.setdefault(name, []).append(patch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
