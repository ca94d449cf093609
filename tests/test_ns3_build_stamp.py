"""ns3-scratch/Makefile dates an object to the start of its compile, so an edit made mid-compile is rebuilt later."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("make") is None, reason="needs g++, make")


def _tree(tmp_path: Path) -> Path:
    """A copy of the Makefile over one model source and header, and a compiler that edits the header mid-compile."""
    (tmp_path / "model").mkdir()
    shutil.copy(ROOT / "ns3-scratch" / "Makefile", tmp_path / "Makefile")
    (tmp_path / "model" / "a.h").write_text("inline int A() { return 1; }\n")
    (tmp_path / "model" / "a.cc").write_text('#include "a.h"\nint B() { return A(); }\n')
    cxx = tmp_path / "editing-cxx"
    # the header is edited while the compile runs (the source was read before: the object holds the old header)
    cxx.write_text(f'#!/bin/sh\nsleep 0.05\ntouch "{tmp_path}/model/a.h"\nexec g++ "$@"\n')
    cxx.chmod(0o755)
    return tmp_path


def _make(tree: Path, *args: str) -> int:
    cmd = ["make", "-s", "-C", str(tree), "NS3_DIR=/nonexistent", f"CXX={tree / 'editing-cxx'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).returncode


def test_a_header_edited_during_the_compile_leaves_the_object_out_of_date(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert _make(tree, "build/obj/model/a.o") == 0
    assert (tree / "build/obj/model/a.o").stat().st_mtime_ns < (tree / "model/a.h").stat().st_mtime_ns
    assert _make(tree, "-q", "build/obj/model/a.o") == 1  # make -q: 1 means "would rebuild"
    assert not (tree / "build/obj/model/a.o.start").exists()


def test_an_untouched_tree_is_up_to_date(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "editing-cxx").write_text('#!/bin/sh\nexec g++ "$@"\n')
    assert _make(tree, "build/obj/model/a.o") == 0
    assert _make(tree, "-q", "build/obj/model/a.o") == 0
