"""A `threading.Thread` the program starts runs GPU work on the simulated device (gpu_threads.py; its timing:
test_simcuda_thread_streams.py). Work there that phantora cannot run ends the rank on phantora's one line naming the
thread's call (bootstrap.py `_stop_on_thread_gpu_work`): Python's thread hook would print the error and let the
program go on without that work, its run reported as a success. In phantom mode `torch.nonzero` of phantom data
has no size (its output's depends on the values). Until 2026-12-05 a thread's `torch.zeros(3, device="cuda")`
reached this CPU build's missing CUDA kernels (torch's dispatch modes are per thread), and ended the rank so."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.client import BridgeError
from phantora.launcher import RunConfig, launch

PROGRAM = """
import sys, threading, torch
x = torch.ones(4, device="cuda")
def work():
    torch.nonzero(x)
t = threading.Thread(target=work)
t.start()
t.join()
open(sys.argv[1], "w").write("went on")
"""


def test_work_a_programs_thread_cannot_run_ends_the_rank_in_one_line(tmp_path: Path) -> None:
    script, marker = tmp_path / "threaded.py", tmp_path / "went_on"
    script.write_text(PROGRAM)
    with pytest.raises(BridgeError):
        launch(RunConfig(str(script), [str(marker)], "testbed16", nproc=1, tensors="phantom", out_dir=tmp_path / "o"))
    last = (tmp_path / "o" / "logs" / "rank0.log").read_text().strip().splitlines()[-1]
    assert last.startswith("phantora: rank 0 failed (at ") and "threaded.py:5 in work" in last
    assert "PhantomValueError: phantom mode: `torch.nonzero(x)` takes the nonzero elements of phantom data" in last
    assert not marker.exists()  # the program did not go on without the thread's work
