"""`--gpu` on a loaded topology (phantora/run_gpu.py, launcher.resolve_topology): the run's GPU becomes the
topology's GPU model, so NCCL's tuning follows it; the links stay the topology's, and a note says where they differ
from the GPU's own NVLink (A100: 300 GB/s a direction, 2400 Gbps; H100: 450 GB/s, 3600 Gbps: NVIDIA's data sheets)."""

from __future__ import annotations

import pytest

from phantora.launcher import resolve_topology
from phantora.topology import dgx_host


def test_gpu_replaces_the_model_of_a_copy(capsys: pytest.CaptureFixture[str]) -> None:
    given = dgx_host(8, gpu="h100")
    topo = resolve_topology(given, "A100", "phantora run")
    assert topo.gpu_model == "a100" and given.gpu_model == "h100"  # the caller's topology is not changed
    err = capsys.readouterr().err
    assert err.startswith("phantora run: note: --gpu a100 keeps")
    assert "3600Gbps a direction (a100's own: 2400Gbps)" in err


def test_no_gpu_keeps_the_topology(capsys: pytest.CaptureFixture[str]) -> None:
    given = dgx_host(8, gpu="h100")
    assert resolve_topology(given) is given and given.gpu_model == "h100"
    assert capsys.readouterr().err == ""


def test_same_nvlink_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """H200 has H100's NVLink (450 GB/s a direction): no note."""
    topo = resolve_topology(dgx_host(8, gpu="h100"), "h200")
    assert topo.gpu_model == "h200" and capsys.readouterr().err == ""
