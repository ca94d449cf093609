"""`torch.cuda.memory_summary()` on the simulated GPU (`simcuda/memory_summary.py`): the modelled figures of
`memory_stats` in torch's frame, the rest said not modelled. Before, it ended the program with
`KeyError: 'allocated_bytes.all.allocated'` (torch's summary reads per-pool totals the model has no figures for)."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch
from phantora.runtime.simcuda.memory_summary import size, summary

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_memory_summary.py"
MiB = 1 << 20


def row(text: str, name: str) -> list[str]:
    """The cells of the summary's row `name`."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {name} ")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_sizes_are_in_binary_units() -> None:
    assert [size(n).strip() for n in (512, 10239, 10240, 4 * MiB, 20 * MiB, 3 << 30)] == [
        "512 B", "10239 B", "10.0 KiB", "4096.0 KiB", "20.0 MiB", "3072.0 MiB"]  # fmt: skip


def test_the_summary_holds_the_stats_figures() -> None:
    stats = {"allocated_bytes.all.current": 4 * MiB, "allocated_bytes.all.peak": 12 * MiB,
             "active_bytes.all.current": 4 * MiB, "active_bytes.all.peak": 12 * MiB,
             "reserved_bytes.all.current": 20 * MiB, "reserved_bytes.all.peak": 22 * MiB,
             "segment.all.current": 2, "inactive_split_bytes.all.current": 512, "num_ooms": 1}  # fmt: skip
    text = summary(stats, 3)
    assert "device ID 3" in text and "CUDA OOMs: 1 " in text
    assert row(text, "Allocated memory") == ["Allocated memory", "4096.0 KiB", "12.0 MiB"]
    assert row(text, "GPU reserved memory") == ["GPU reserved memory", "20.0 MiB", "22.0 MiB"]
    assert row(text, "GPU reserved segments") == ["GPU reserved segments", "2", "n/a"]
    assert all(len(line) == 77 for line in text.splitlines())


def test_a_program_prints_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, tensors="real", trace="none",
                     out_dir=tmp_path / "run"))  # fmt: skip
    seen = json.loads(out.read_text())
    assert seen["allocated"] >= 4 * MiB and seen["peak"] >= seen["allocated"] + 8 * MiB
    cells = row(seen["summary"], "Allocated memory")
    assert cells[1:] == [size(seen["allocated"]).strip(), size(seen["peak"]).strip()]
