"""A started process's own peak RSS (`bridge.peak_rss`): not its parent's, which `ru_maxrss` keeps across exec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.peak_rss import peak_rss_kb

ROOT = Path(__file__).resolve().parents[1]
CHILD = (
    "import resource, sys; sys.path.insert(0, sys.argv[1]); from bridge.peak_rss import peak_rss_kb; "
    "print(peak_rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_a_child_reports_its_own_peak_not_its_parents() -> None:
    held = bytearray(300 << 20)  # the parent touches 300 MiB before starting the child
    held[::4096] = b"\1" * len(held[::4096])
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], capture_output=True, text=True, check=True)
    own, inherited = (int(x) for x in out.stdout.split())
    assert inherited >= 300 << 10  # ru_maxrss: the parent's peak, carried across fork and exec
    assert own < 100 << 10  # a bare interpreter's own peak
    assert peak_rss_kb() >= 300 << 10  # and this process's own includes what it holds
    del held


def test_without_vmhwm_it_falls_back_to_ru_maxrss(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  1234 kB\n")
    assert peak_rss_kb(status) > 0 and peak_rss_kb(status) != 1234
