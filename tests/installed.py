"""Skip a test module whose framework is not installed, without importing the framework at collection.

`pytest.importorskip("megatron.core")` at module level imports the package in every pytest-xdist worker that
collects the file (megatron-core, transformers + accelerate and deepspeed: about 6 CPU s a worker over torch),
although the tests run it in rank processes only. `needs(...)` asks the import system where the package is
(`importlib.util.find_spec`) and imports nothing but a dotted name's parents.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def installed(name: str) -> bool:
    """Whether the module `name` can be imported (its parent packages are imported to find it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def needs(*names: str) -> pytest.MarkDecorator:
    """A skip mark for a module's `pytestmark` when any of `names` is not installed."""
    missing = [n for n in names if not installed(n)]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def package_dir(name: str) -> Path:
    """The directory of an installed package, found without importing it (its `__file__`'s parent); `Path()` if
    it is not installed (the module that asks is skipped by `needs`)."""
    spec = importlib.util.find_spec(name) if installed(name) else None
    return Path(spec.origin).parent if spec is not None and spec.origin is not None else Path()
