"""A program that starts its own processes per GPU (torch.multiprocessing.spawn, as pytorch/examples'
ddp-tutorial-series/multigpu.py does) runs them outside phantora without --spawn: when one uses CUDA, the run ends
on phantora's one line naming the call and the launch that works (`phantora run --spawn`), not on the child's
traceback."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from phantora.runtime.unsupported import explain


def _child(rank: int) -> None:
    torch.cuda.set_device(rank)  # this CPU build's torch: no CUDA


def test_a_spawned_process_using_cuda_is_named_in_one_line() -> None:
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(_child, nprocs=1)
    line = explain(info.value)
    assert line is not None and "\n" not in line
    assert line.startswith("NotSimulatedError: `mp.spawn(_child, nprocs=1)` started processes of its own")
    assert "phantora run --spawn --nproc N script.py" in line and "each process it starts is a rank" in line


def test_other_failures_of_a_spawned_process_are_left_as_they_are() -> None:
    assert explain(mp.ProcessRaisedException("ValueError: bad input", 0, 1)) is None
