"""A rank the kernel's OOM killer killed is named as such, with what to do (bridge/oom.py, issue 34)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

from bridge import oom, supervisor


def test_the_kill_count_is_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 7\npgfault 99\n")
    assert oom.kills(vmstat) == 7
    vmstat.write_text("nr_free_pages 12\n")
    assert oom.kills(vmstat) is None  # a kernel that does not count them
    assert oom.kills(tmp_path / "absent") is None


def test_only_a_sigkill_while_the_count_rose_is_put_down_to_the_oom_killer() -> None:
    kill = -signal.SIGKILL
    note = oom.explain(kill, 3, 4)
    assert note is not None and "OOM killer" in note and "1 OOM kill on" in note
    assert "--phantom" in note and "--nproc" in note and "smaller configuration" in note
    assert "2 OOM kills" in (oom.explain(kill, 3, 5) or "")
    assert oom.explain(kill, 3, 3) is None  # the count did not move: some other SIGKILL
    assert oom.explain(-signal.SIGTERM, 3, 4) is None and oom.explain(1, 3, 4) is None
    assert oom.explain(kill, None, 4) is None and oom.explain(kill, 3, None) is None


def test_a_childs_exit_names_the_oom_killer(monkeypatch, tmp_path: Path) -> None:
    child = supervisor.Child("rank", 1, SimpleNamespace(returncode=-signal.SIGKILL, pid=42), tmp_path / "log")
    child.oom_kills = 10
    monkeypatch.setattr(oom, "kills", lambda vmstat=oom.VMSTAT: 11)
    text = child.exit_text()
    assert text.startswith("was killed by SIGKILL, by the kernel's OOM killer") and "--phantom" in text
    monkeypatch.setattr(oom, "kills", lambda vmstat=oom.VMSTAT: 10)
    assert child.exit_text() == "was killed by SIGKILL"
