"""The current stream is per host thread, and a thread's kernels run on its own current stream (simcuda/streams.py,
dispatch.py, gpu_threads.py), as CUDA's: real `threading.Thread`s of a rank's program on the simulated GPU.

One rank under the roofline model: an add of two 2^20-element fp32 tensors moves 3 x 4 MiB through HBM, so it
takes A = ceil(12 MiB / bandwidth) ns plus the launch overhead. Each thread runs K adds in `with
torch.cuda.stream(s)`, and the program times the threads from their start to a device synchronise with its own
events: two threads on two streams overlap (K A), two on one stream or both on the default stream run in turn
(2 K A); a thread on a side stream runs beside the program's K adds on the default stream (K A), one on the
default stream in turn with them (2 K A). A thread's event on its side stream records that stream's time, and the
program's `wait_stream` of it holds the default stream's next add until then. The trace shows each side stream's
lane as a track of its own. A fresh thread's current stream is
the default stream after the program set its own, and a thread that sets one leaves the program's as it was.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.trace import TID_STREAMS

K = 3
PROGRAM = """
    import json, sys, threading, torch
    N, K = 1 << 20, 3
    x, y = torch.ones(N, device="cuda"), torch.ones(N, device="cuda")
    seen = {}

    def adds(stream, marks=None):
        with torch.cuda.stream(stream):
            for _ in range(K):
                torch.add(x, y)
            if marks is not None:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
            seen.setdefault("devices", set()).add(str(torch.add(x, y, alpha=0).device))

    def elapsed(streams, main_adds=0, marks=None, wait=None):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        threads = [threading.Thread(target=adds, args=(s, marks)) for s in streams]
        for t in threads:
            t.start()
        for _ in range(main_adds):
            torch.add(x, y)
        for t in threads:
            t.join()
        if wait is not None:  # the default stream waits for the side stream's work, then adds once more
            torch.cuda.current_stream().wait_stream(wait)
            torch.add(x, y)
            b.record()
        else:
            torch.cuda.synchronize()
            b.record()
        return round(a.elapsed_time(b) * 1e6), a

    one, two = torch.cuda.Stream(), torch.cuda.Stream()
    for name, streams, main_adds in [
        ("two_streams", [one, two], 0), ("one_stream", [one, one], 0), ("default", [None, None], 0),
        ("side_beside_main", [one], K), ("default_beside_main", [None], K),
    ]:
        seen[name] = elapsed(streams, main_adds)[0]
    marks = []
    seen["waited"], a = elapsed([one], 0, marks, wait=one)
    seen["event"] = round(a.elapsed_time(marks[0]) * 1e6)
    mine = torch.cuda.Stream()
    torch.cuda.set_stream(mine)
    fresh = {}

    def look():
        fresh["stream"] = torch.cuda.current_stream() == torch.cuda.default_stream()
        torch.cuda.set_stream(torch.cuda.Stream())
        fresh["own"] = torch.cuda.current_stream() != torch.cuda.default_stream()

    t = threading.Thread(target=look)
    t.start()
    t.join()
    seen.update(fresh, kept=torch.cuda.current_stream() == mine, devices=sorted(seen["devices"]))
    json.dump(seen, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_threads_kernels_run_on_their_own_current_streams(tmp_path: Path, tensors: str) -> None:
    script, out = tmp_path / "threads.py", tmp_path / "seen.json"
    script.write_text(textwrap.dedent(PROGRAM))
    launch(RunConfig(str(script), [str(out)], "testbed16", nproc=1, gpu="h100", tensors=tensors,
                     compute_model="roofline", out_dir=tmp_path / "run", timeout_s=300))  # fmt: skip
    seen = json.loads(out.read_text())
    add = math.ceil(3 * 4 * (1 << 20) / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    assert seen["devices"] == ["cuda:0"]  # a thread's ops are the simulated GPU's
    # each thread's K + 1 adds (the last one's output tells its device), on its stream
    assert seen["two_streams"] == (K + 1) * add  # two streams: the threads overlap
    assert seen["one_stream"] == 2 * (K + 1) * add  # one stream: in turn
    assert seen["default"] == 2 * (K + 1) * add  # the default stream, one for all threads: in turn
    assert seen["side_beside_main"] == (K + 1) * add  # beside the program's K adds on the default stream
    assert seen["default_beside_main"] == (2 * K + 1) * add  # in turn with them
    assert seen["event"] == K * add  # recorded on the thread's stream after its K adds
    assert seen["waited"] == (K + 2) * add  # the default stream's add after the side stream's K + 1
    assert seen["stream"] is True and seen["own"] is True and seen["kept"] is True
    # the trace: a track per side stream; the first phase's two threads side by side, each K + 1 adds back to back
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") == "X" and e["tid"] >= TID_STREAMS:
            tracks.setdefault(e["tid"], []).append((e["ts"], e["dur"]))
    assert len(tracks) == 2
    one, two = (sorted(spans) for _, spans in sorted(tracks.items()))
    assert len(two) == K + 1 and one[: K + 1] == two  # two streams: the same spans, at once
    turn = one[K + 1 : 3 * (K + 1)]  # then two threads on stream one: in turn, 2 (K + 1) adds back to back
    assert [dur for _, dur in turn] == [add / 1e3] * 2 * (K + 1)
    assert [ts for ts, _ in turn] == pytest.approx([turn[0][0] + i * add / 1e3 for i in range(2 * (K + 1))])


BACKWARD = """
    import json, sys, threading, torch
    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    x = torch.randn(64, 256, device="cuda")
    side, where = torch.cuda.Stream(), {}
    w.register_hook(lambda grad: where.update(hook=threading.get_ident()))

    def step():
        where["thread"] = threading.get_ident()
        with torch.cuda.stream(side):
            (x @ w).sum().backward()

    t = threading.Thread(target=step)
    t.start()
    t.join()
    torch.cuda.synchronize()
    json.dump({"same": where["hook"] == where["thread"], "grad": str(w.grad.device)}, open(sys.argv[1], "w"))
"""


def test_a_threads_backward_runs_on_that_thread_and_its_stream(tmp_path: Path) -> None:
    """autograd's engine runs a cuda tensor's backward on its own device threads unless told not to (per thread, as
    the program's thread is: simcuda/device.py); a thread's backward then ran there, outside the rank, uncharged."""
    script, out = tmp_path / "backward.py", tmp_path / "seen.json"
    script.write_text(textwrap.dedent(BACKWARD))
    launch(RunConfig(str(script), [str(out)], "testbed16", nproc=1, out_dir=tmp_path / "run", timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen == {"same": True, "grad": "cuda:0"}
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = sorted((e["ts"], e["tid"], e["name"]) for e in events if e.get("ph") == "X" and str(e["pid"]) == "0")
    # the program's two factories on the compute lane, then the thread's forward (mm, sum) and backward (the seed
    # gradient, the weight's gradient mm; the input needs none) on the side stream's track
    assert [(tid >= TID_STREAMS, name) for _, tid, name in spans if not name.startswith("step")] == [
        (False, "aten.randn"), (False, "aten.randn"),
        (True, "aten.mm"), (True, "aten.sum"), (True, "aten.ones_like"), (True, "aten.mm"),
    ]  # fmt: skip
