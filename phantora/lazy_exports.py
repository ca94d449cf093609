"""A package's exported names loaded from their submodules on first use (PEP 562 module `__getattr__`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, home: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: name -> `package.home[name]`'s attribute, imported then and kept."""

    def load(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return load
