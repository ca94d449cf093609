"""GPU work on a `threading.Thread` the program starts is not simulated (torch's dispatch modes are per thread): a
device factory there reaches this CPU build's missing CUDA kernels. The rank now ends on phantora's one line naming
the thread's call (bootstrap.py `_stop_on_thread_gpu_work`); before, Python's thread hook printed torch's error of
some hundred lines and the program went on without that work, its run reported as a success."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.client import BridgeError
from phantora.launcher import RunConfig, launch

PROGRAM = """
import sys, threading, torch
x = torch.ones(4, device="cuda")
def work():
    torch.zeros(3, device="cuda")
t = threading.Thread(target=work)
t.start()
t.join()
open(sys.argv[1], "w").write("went on")
"""


def test_gpu_work_on_a_programs_thread_ends_the_rank_in_one_line(tmp_path: Path) -> None:
    script, marker = tmp_path / "threaded.py", tmp_path / "went_on"
    script.write_text(PROGRAM)
    with pytest.raises(BridgeError):
        launch(RunConfig(str(script), [str(marker)], "testbed16", nproc=1, out_dir=tmp_path / "out"))
    last = (tmp_path / "out" / "logs" / "rank0.log").read_text().strip().splitlines()[-1]
    assert last.startswith("phantora: rank 0 failed (at ") and "threaded.py:5 in work" in last
    assert 'NotSimulatedError: `torch.zeros(3, device="cuda")` ran GPU work on a thread other than the program' in last
    assert not marker.exists()  # the program did not go on without the thread's work
