"""`phantora run --memory-check` (phantora/memcheck.py): a real-mode run's host memory estimated from a one-step
phantom probe (each rank's device-memory peak plus its process), against MemAvailable; closed forms on made-up
probe results, and (slow) a probe of a real program whose tensors are known."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.memcheck import GIB, available_bytes, estimate, probe

ROOT = Path(__file__).resolve().parents[1]


def ranks(peaks_gib: list[float], pss_mb: float) -> dict[int, dict]:
    return {r: {"memory": {"peak_bytes": int(p * GIB)}, "pss_mb": pss_mb} for r, p in enumerate(peaks_gib)}


def test_the_estimate_is_tensors_plus_processes_over_the_ranks() -> None:
    """4 ranks of 3 GiB of tensors and 512 MiB of process: 14 GiB; 24 GiB free fits, 12 GiB does not."""
    roomy = estimate(ranks([3, 3, 3, 3], 512), 24 * GIB)
    assert roomy.total == 14 * GIB and roomy.fits()
    assert roomy.line() == (
        "memory check: real mode needs about 14.0 GiB of host memory for 4 ranks (3.00 GiB of tensors and 0.50 GiB "
        "of process at most per rank, from a one-step phantom probe); 24.0 GiB available: it fits"
    )
    tight = estimate(ranks([3, 3, 3, 3], 512), 12 * GIB)
    assert not tight.fits() and "\n" not in tight.line()
    assert tight.line().endswith("more than the 12.0 GiB available: run with --phantom (shapes only, no tensor data), "
                                 "fewer ranks (--nproc) or a smaller configuration")  # fmt: skip
    assert tight.line(switched=True).endswith("running in phantom mode (--tensors auto)")
    assert estimate(ranks([1], 0), None).fits()
    with pytest.raises(InputError, match="rank 0 gave no memory results"):
        estimate({0: {}}, None)


def test_available_bytes_reads_meminfo(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n")
    assert available_bytes(info) == 20480000 * 1024
    assert available_bytes(tmp_path / "absent") is None


@pytest.mark.slow
def test_a_probe_measures_the_programs_tensors(tmp_path: Path) -> None:
    """tests/scripts/storage_writers.py on 2 ranks: a 2**20-float parameter and its gradient, 8 MiB, at least,
    on each rank's simulated GPU in the first step; each process (its proportional set: ranks fork from one
    interpreter, which shares torch among them) between 50 MiB and 2 GiB."""
    from phantora.launcher import RunConfig

    cfg = RunConfig(str(ROOT / "tests" / "scripts" / "storage_writers.py"), [str(tmp_path)], "testbed16", nproc=2)
    cfg.timeout_s = 300
    est = probe(cfg)
    assert len(est.device_peak) == 2 and all(p >= 8 * 2**20 for p in est.device_peak)
    assert all(50 * 2**20 < p < 2 * 2**30 for p in est.process)  # forked from one interpreter: its share
    assert not (tmp_path / "all0.pt").exists()  # the probe ended after its first step, before the saves


def test_auto_runs_phantom_when_the_ranks_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """--tensors auto with an estimate over the memory free: phantom; --tensors real: kept, the line says what to
    do; phantom, or auto above 16 ranks: nothing to check (no probe)."""
    from phantora import memcheck
    from phantora.launcher import RunConfig

    probes: list[str] = []

    def fake(cfg: RunConfig) -> memcheck.Estimate:
        probes.append(cfg.tensors)
        return estimate(ranks([3, 3, 3, 3], 512), 12 * GIB)

    monkeypatch.setattr(memcheck, "probe", fake)
    auto, line = memcheck.checked(RunConfig("x.py", nproc=4), 4)
    assert auto.tensors == "phantom" and line is not None and line.endswith("(--tensors auto)")
    real, line = memcheck.checked(RunConfig("x.py", nproc=4, tensors="real"), 4)
    assert real.tensors == "real" and line is not None and "run with --phantom" in line
    assert memcheck.checked(RunConfig("x.py", tensors="phantom"), 4)[1] is None
    assert memcheck.checked(RunConfig("x.py", nproc=32), 32)[1] is None
    assert probes == ["auto", "real"]


def test_the_cpu_attention_workspace_is_counted_per_rank() -> None:
    """2 ranks of 1 GiB of tensors, 256 MiB of FlexAttention workspace and 512 MiB of process: 3.5 GiB."""
    probe_ranks = ranks([1, 1], 512)
    for r in probe_ranks.values():
        r["host_workspace_bytes"] = 256 * 2**20
    est = estimate(probe_ranks, 24 * GIB)
    assert est.total == int(3.5 * GIB)
    assert "(1.00 GiB of tensors, 0.25 GiB of CPU attention workspace and 0.50 GiB of process at most" in est.line()


def test_a_flex_attention_slice_is_at_most_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspace is 6.5 fp32 score matrices of a slice: the whole matrix when it is under 32 MiB (batch 2, 16
    heads, sequence 512: 32 MiB exactly), 32 MiB of rows otherwise (batch 8, sequence 2048: 32 rows of 1 MiB)."""
    import torch

    from phantora.runtime import flex_chunks

    monkeypatch.setattr(flex_chunks, "_largest", 0)
    flex_chunks.note(torch.empty(2, 16, 512, 16, device="meta"), 512)
    assert flex_chunks.workspace_bytes() == int(6.5 * 2 * 16 * 512 * 512 * 4)
    flex_chunks.note(torch.empty(8, 16, 2048, 16, device="meta"), 2048)
    assert flex_chunks.workspace_bytes() == int(6.5 * 32 * 2**20)


@pytest.mark.slow
def test_the_model_is_within_3_percent_of_a_real_runs_peak(tmp_path: Path) -> None:
    """torchtitan's llama3_debugmodel, FSDP 2, sequence 512, batch 2, 2 steps (about 2 min on the shared machine):
    each real-mode rank's peak resident set against the model, the same run's phantom rank peak resident set + its
    simulated-GPU peak + 6.5 fp32 score matrices (2 x 16 x 512 x 512 x 4 B = 32 MiB, one slice). Since real-mode
    ranks fix glibc's mmap threshold (92f995a, freed tensor data returned) the model is within 3 % of the need, as
    runtime.md's "Host memory" says (before it, 743 MiB modelled against 820 measured). Measured 2026-11-30 at
    e6a3558: 757.6 / 754.4 MiB modelled against 744.3 / 743.8 (+1.8 / +1.4 %)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("torchtitan")
    import torchtitan

    sys.path.insert(0, str(ROOT / "tests"))
    from frameworks.assets import make_torchtitan_assets

    work = make_torchtitan_assets(tmp_path / "titan")
    train = str(Path(torchtitan.__file__).parent / "train.py")
    args = ["--module", "llama3", "--config", "llama3_debugmodel", "--parallelism.spmd_backend", "partial_dtensor"]
    args += ["--training.disable_cuda_graphs", "--training.steps", "2", "--training.local_batch_size", "2"]
    args += ["--training.seq_len", "512"]
    runs = {}
    for mode in ("phantom", "real"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--nproc", "2"]
        cmd += ["--tensors", mode, "--out", str(out), "--no-progress", train, *args]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[mode] = json.loads((out / "results.json").read_text())
    matrix = 2 * 16 * 512 * 512 * 4
    for phantom, real in zip(runs["phantom"]["ranks"], runs["real"]["ranks"], strict=True):
        tensors = runs["phantom"]["memory"]["per_rank_peak_bytes"][phantom["rank"]] / 2**20
        model = phantom["peak_rss_mb"] + tensors + 6.5 * matrix / 2**20
        assert 0.97 * real["peak_rss_mb"] <= model <= 1.03 * real["peak_rss_mb"], (model, real["peak_rss_mb"])
