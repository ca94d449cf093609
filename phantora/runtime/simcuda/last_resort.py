"""A finder of simulated packages placed after every other finder: `import NAME` gets the simulated module only where
nothing installed provides one (simapex.py, simflash.py)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType


class LastResort(importlib.abc.MetaPathFinder):
    """Finds the modules of `modules` (name -> whether it is a package), each loaded by `loader`."""

    def __init__(self, modules: Mapping[str, bool], loader: importlib.abc.Loader) -> None:
        self.modules, self.loader = dict(modules), loader

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=self.modules[fullname])

    def install(self) -> None:
        """Put this finder last in `sys.meta_path`, once."""
        if self not in sys.meta_path:
            sys.meta_path.append(self)
