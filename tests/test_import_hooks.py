"""Patches that wait for a module's import (runtime/import_hooks.py), and the torch backport that uses one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from phantora.runtime.import_hooks import after_import

ROOT = Path(__file__).resolve().parents[1]


def test_patch_runs_after_import_and_at_once_when_imported(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "phantora_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def patch(m: ModuleType) -> None:
        seen.append(m.VALUE)
        m.VALUE = 2

    after_import("phantora_probe_mod", patch)
    assert seen == [] and "phantora_probe_mod" not in sys.modules  # nothing imported by phantora
    import phantora_probe_mod

    assert seen == [1] and phantora_probe_mod.VALUE == 2  # patched after its own code ran
    after_import("phantora_probe_mod", patch)  # already imported: at once
    assert seen == [1, 2]
    monkeypatch.delitem(sys.modules, "phantora_probe_mod")


def test_pipeline_step_takes_split_microbatches_once_installed() -> None:
    """torch 2.13's schedule.step gains arg_mbs/kwarg_mbs/target_mbs (newer torch's), only on import."""
    code = textwrap.dedent(
        """
        import inspect, sys
        from phantora.runtime import torch_backports
        torch_backports.install()
        assert "torch.distributed.pipelining.schedules" not in sys.modules
        from torch.distributed.pipelining import schedules
        s = schedules
        for cls in (s.PipelineScheduleSingle, s.PipelineScheduleMulti, s.ScheduleInterleaved1F1B):
            assert cls.step.__name__ == "step" and hasattr(cls.step, "__wrapped__"), cls
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
