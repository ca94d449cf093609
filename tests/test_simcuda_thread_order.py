"""Kernels of two host threads on one stream run in the order of their launches in simulated time, not in the order
the host's scheduler ran them (runtime/host_clocks.py): the same start times run after run.

One rank under the roofline model, with the host model on (one host thread): two threads the program starts each
launch K adds of two 2^20-element fp32 cuda tensors on the default stream, and between launches run a host add of
M_i fp32 elements, so thread i's host spends the launch overhead L and then W_i = ceil(12 M_i / core_bw) ns
(`hosts.op_ns`: three arrays of M_i floats through one core; fewer than GRAIN elements, no fresh mapping) from one
launch to the next: its j-th launch is at C + j (L + W_i), C the compute lane's time at their start. A kernel takes
A = ceil(12 MiB / HBM bandwidth) + L, and the default stream runs the launches in their order in simulated time
(ties: the thread started first), each from the later of its launch and the previous kernel's end: a FIFO queue.
Each thread sleeps a random real time before each launch, so the host's scheduler interleaves them differently
every round; five rounds in one run, each one's 2K kernel starts equal to the queue's.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.perfmodel import hosts
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.trace import TID_STREAMS

K, ROUNDS, M = 5, 5, (16384, 28672)
PROGRAM = f"""
    import random, threading, time, torch
    K, ROUNDS, M = {K}, {ROUNDS}, {M}
    x, y = torch.ones(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")

    def launches(a, b):
        for _ in range(K):
            time.sleep(random.random() * 0.003)  # the host's scheduler: a different interleaving each round
            torch.add(x, y)
            torch.add(a, b)  # host work between launches

    host = [(torch.ones(m), torch.ones(m)) for m in M]
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        threads = [threading.Thread(target=launches, args=ab) for ab in host]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    torch.cuda.synchronize()
"""


def expected_starts() -> list[int]:
    """The 2K kernel starts after C: launches in (time, thread) order, each from max(launch, previous end)."""
    add = math.ceil(3 * 4 * (1 << 20) / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    share = hosts.rank_share(hosts.host_of_gpu("h100"), 1, 1)
    work = [hosts.op_ns(share, 3 * 4 * m, m, m) for m in M]
    assert work == [math.ceil(3 * 4 * m / share.bw * 1e9) for m in M]  # bandwidth-bound
    launched = sorted((j * (DEFAULT_LAUNCH_NS + w), i) for i, w in enumerate(work) for j in range(K))
    starts, free = [], 0
    for at, _ in launched:
        starts.append(max(at, free))
        free = starts[-1] + add
    return starts


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_two_threads_on_the_default_stream_run_in_simulated_launch_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tensors: str
) -> None:
    monkeypatch.setenv("PHANTORA_HOST_COMPUTE", "on")
    monkeypatch.setenv("PHANTORA_HOST_THREADS", "1")
    script = tmp_path / "order.py"
    script.write_text(textwrap.dedent(PROGRAM))
    launch(RunConfig(str(script), [], "testbed16", nproc=1, gpu="h100", tensors=tensors, compute_model="roofline",
                     out_dir=tmp_path / "run", timeout_s=300))  # fmt: skip
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    adds = sorted(e["ts"] for e in events if e.get("ph") == "X" and e["tid"] < TID_STREAMS and e["name"] == "aten.add")
    assert len(adds) == ROUNDS * 2 * K
    want = [ns / 1e3 for ns in expected_starts()]
    for r in range(ROUNDS):
        starts = adds[r * 2 * K : (r + 1) * 2 * K]
        assert [ts - starts[0] for ts in starts] == pytest.approx(want, abs=1e-3), f"round {r}"
