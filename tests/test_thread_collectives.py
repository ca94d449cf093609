"""An NCCL collective issued from a thread the program started (session.py `_thread_issue`, host_clocks.py): real
torch.distributed on 2 ranks of one H100 host (testbed16), the default group's all-reduce of 4 MiB from a
`threading.Thread`, on the default stream or a side stream.

The thread times it with its own events on its stream: the call's host launch (from a synchronise, the GPU idle)
and NCCL's Simple ring on two H100s, written out in tests/test_backend_identity.py (`ring_all_reduce_ns`: 38.34 us)
after the host's 4.26 us + 24 x 32 ns launch: 43.37 us, on either stream's lane. In real mode the data is gloo's:
each rank's tensor equals gloo's all-reduce of the same values. A rank whose thread all-reduces while the other
rank's program broadcasts at the same place breaks NCCL's contract (every rank issues a communicator's calls in
one order): the run stops on the coordinator's mismatch, naming each rank's call and the thread that issued it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, HOST_CHANNEL_US, HOST_LAUNCH_US
from phantora.errors import PhantoraError
from phantora.launcher import RunConfig, launch
from tests.test_backend_identity import SIZE, ring_all_reduce_ns

SCRIPT = Path(__file__).resolve().parent / "scripts" / "thread_collective.py"


def run(tmp: Path, where: str, tensors: str = "real") -> list[dict[str, Any]]:
    seen = tmp / "seen"
    seen.mkdir()
    args = [str(seen), where] + (["phantom"] if tensors == "phantom" else [])
    launch(RunConfig(str(SCRIPT), args, "testbed16", nproc=2, tensors=tensors, trace="none", out_dir=tmp / "run",
                     timeout_s=300))  # fmt: skip
    return [json.loads((seen / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(("where", "tensors"), [("default", "real"), ("side", "real"), ("side", "phantom")])
def test_a_threads_all_reduce_moves_glooss_values_in_the_ring_time_on_its_lane(
    tmp_path: Path, where: str, tensors: str
) -> None:
    want_ns = ring_all_reduce_ns(2, SIZE) + 1000 * (HOST_LAUNCH_US + HOST_CHANNEL_US * DEFAULT_BATCHES)
    for seen in run(tmp_path, where, tensors):
        assert seen["ns"] == pytest.approx(want_ns, abs=1)  # whole ns
        if tensors == "real":
            assert seen["equal"] is True and seen["value"] == 1.0 + 2.0


def test_a_thread_and_a_program_crossing_their_calls_stop_the_run_naming_both(tmp_path: Path) -> None:
    with pytest.raises(PhantoraError) as err:
        run(tmp_path, "crossed")
    text = str(err.value)
    assert "collective mismatch on group [0, 1] seq 0" in text
    assert """rank 0 called all_reduce 'all_reduce#0 from thread "background all-reduce"'""" in text
    assert "rank 1 called broadcast 'broadcast#0 from the program's thread'" in text
