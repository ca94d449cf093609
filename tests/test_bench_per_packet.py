"""bench/bench_per_packet.py: --cache-sim without valgrind stops with one line naming valgrind."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_cache_sim_without_valgrind_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # it imports bench_packet as a top-level module
    import bench_per_packet

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None if cmd == "valgrind" else real(cmd, *a, **k))
    monkeypatch.setattr(sys, "argv", ["bench_per_packet.py", "--cache-sim", "--no-callgrind"])
    with pytest.raises(SystemExit, match="--cache-sim needs valgrind") as got:
        bench_per_packet.main()
    assert "\n" not in str(got.value)
