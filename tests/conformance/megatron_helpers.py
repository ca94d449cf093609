"""Megatron's dataset helpers (`megatron/core/datasets/helpers_cpp*.so`), built once per machine for the tests.

Megatron's start-up runs `make` in a checkout's megatron/core/datasets, which compiles helpers.cpp with pybind11:
14 CPU s, in every test session that copies the vendored checkout. `reuse` puts the helpers a session built before
(the same helpers.cpp, Makefile, Python and pybind11) into a fresh copy, newer than their source, so that Megatron's
`make` finds them up to date, as in a user's checkout after its first run; `keep` saves what a run built."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from phantora.resources import cache_dir

FOLDER = "megatron/core/datasets"
BUILT = "helpers_cpp*"  # $(LIBNAME)$(LIBEXT) in the Makefile


def _cache(checkout: Path) -> Path:
    """The cache folder of this checkout's helpers for this interpreter."""
    digest = hashlib.sha256()
    for name in ("helpers.cpp", "Makefile"):
        digest.update((checkout / FOLDER / name).read_bytes())
    digest.update(f"{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    digest.update(importlib.metadata.version("pybind11").encode())
    return cache_dir() / "test-megatron-helpers" / digest.hexdigest()[:16]


def reuse(checkout: Path) -> bool:
    """Copy the cached helpers into `checkout`, newer than helpers.cpp; False if none are cached."""
    built = sorted(_cache(checkout).glob(BUILT))
    for path in built:
        dest = checkout / FOLDER / path.name
        shutil.copyfile(path, dest)
        os.utime(dest)  # now: after the source's time, which copytree kept
    return bool(built)


def keep(checkout: Path) -> None:
    """Cache the helpers a run built in `checkout` (once: the first session to finish writes them)."""
    cache = _cache(checkout)
    built = sorted((checkout / FOLDER).glob(BUILT))
    if cache.exists() or not built:
        return
    part = cache.with_name(f"{cache.name}.{os.getpid()}.part")
    part.mkdir(parents=True, exist_ok=True)
    for path in built:
        shutil.copyfile(path, part / path.name)
    try:
        part.rename(cache)
    except OSError:  # another session cached them first
        shutil.rmtree(part, ignore_errors=True)
