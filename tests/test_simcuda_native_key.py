"""The cache key of simcuda's native libraries (simcuda/native.py): a library built with Python's headers is
keyed by the interpreter's ABI too, so one torch version under two Pythons does not share it; the device guard
(no Python headers) keeps the key it had: sha256(source + torch version + compiler), first 16 hex digits."""

from __future__ import annotations

import hashlib
import sysconfig

import pytest

from phantora.runtime.simcuda import native


def test_the_guard_keeps_its_key() -> None:
    want = hashlib.sha256(b"src" + b"2.5.1" + b"g++").hexdigest()[:16]
    assert native.build_key(b"src", "2.5.1", "g++", python=False) == want


def test_a_python_library_is_keyed_by_the_interpreters_abi(monkeypatch: pytest.MonkeyPatch) -> None:
    here = native.build_key(b"src", "2.5.1", "g++", python=True)
    assert here != native.build_key(b"src", "2.5.1", "g++", python=False)
    real = sysconfig.get_config_var
    monkeypatch.setattr(
        sysconfig, "get_config_var", lambda k: "cpython-313t-x86_64-linux-gnu" if k == "SOABI" else real(k)
    )
    assert native.build_key(b"src", "2.5.1", "g++", python=True) != here
