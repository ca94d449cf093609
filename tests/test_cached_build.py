"""phantora.cached_build: a library built once into its cache path (the command runs only when it is missing), and
a failed command's error raised with nothing left at the path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phantora.cached_build import Command, build_once, output_tail


def _writer(text: str, calls: list[Path]) -> Command:
    def command(tmp: Path) -> list[str]:
        calls.append(tmp)
        return [sys.executable, "-c", f"open({str(tmp)!r}, 'w').write({text!r})"]

    return command


def _never(cmd: list[str], proc: subprocess.CompletedProcess[str]) -> Exception:
    raise AssertionError("the command succeeded")


def test_builds_once_into_the_path(tmp_path: Path) -> None:
    out = tmp_path / "cache" / "lib-abc.so"
    calls: list[Path] = []
    assert build_once(out, ".lock", _writer("one", calls), _never) == out
    assert build_once(out, ".lock", _writer("two", calls), _never) == out
    assert out.read_text() == "one"
    assert len(calls) == 1 and calls[0].parent == out.parent and calls[0] != out
    assert not calls[0].exists()  # renamed into place


def test_a_failure_raises_its_error_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "lib-abc.so"

    def command(tmp: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; print('a'); print('b', file=sys.stderr); sys.exit(3)"]

    def failed(cmd: list[str], proc: subprocess.CompletedProcess[str]) -> Exception:
        return RuntimeError(f"exit {proc.returncode}: {output_tail(proc, 1)}")

    with pytest.raises(RuntimeError, match=r"^exit 3: b$"):
        build_once(out, ".lock", command, failed)
    assert not out.exists()
