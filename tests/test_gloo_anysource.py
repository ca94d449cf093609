"""`recv` from any source on a gloo group (torch's ProcessGroupGloo recvAnysource), live, real and phantom mode.

Rank 1 computes a 2048^3 matmul before its send to rank 0, rank 2 sends at once in virtual time but later in wall
time (a Python loop the simulation does not charge). Rank 0 receives twice from any source: the coordinator gives it
the matching send issued first in virtual time (bridge/anysource.py), rank 2's, then rank 1's, not the first to reach
it in wall time; `dist.recv` returns that sender, and the data is that sender's (real mode: gloo receives from the
rank the simulation chose; phantom mode: the carried values of a small integer tensor). A real-mode gloo call is a
synchronisation of zero network bytes: each receive ends at the later of its entry and its send's (backend.py
`gloo_sync`). An `irecv` without a source, with a tag, reports its sender through `Work._source_rank()`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

pytestmark = pytest.mark.slow

SCRIPT = """
    import time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    g = dist.new_group([0, 1, 2], backend="gloo")
    a = torch.randn(2048, 2048, device="cuda")

    def send(value, tag=0):
        t0 = time.perf_counter_ns()
        dist.send(torch.full((4,), value, dtype=torch.int64), 0, group=g, tag=tag)
        print("SEND", me, tag, t0, time.perf_counter_ns(), flush=True)

    if me == 1:
        b = a @ a  # rank 1 sends later in virtual time
        send(1)
        send(10, tag=5)
    elif me == 2:
        sum(range(3_000_000))  # ... rank 2 later in wall time
        send(2)
    else:
        for k in range(2):
            x = torch.zeros(4, dtype=torch.int64)
            t0 = time.perf_counter_ns()
            src = dist.recv(x, group=g)
            print("RECV", k, t0, time.perf_counter_ns(), src, x.tolist(), flush=True)
        z = torch.zeros(4, dtype=torch.int64)
        w = dist.irecv(z, group=g, tag=5)
        w.wait()
        print("IRECV", w._source_rank(), z.tolist(), flush=True)
    dist.destroy_process_group()
"""


def _lines(out: Path, word: str, fields: int) -> list[list[str]]:
    text = "".join(f.read_text() for f in sorted((out / "logs").glob("rank*.log")))
    return [ln.split(" ", fields)[1:] for ln in text.splitlines() if ln.startswith(word + " ")]


@pytest.mark.parametrize("mode", ["real", "phantom"])
def test_two_ranks_send_to_rank_0_which_receives_from_any_source(tmp_path: Path, mode: str) -> None:
    (tmp_path / "prog.py").write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(tmp_path / "prog.py"), topology="testbed16", nproc=3, tensors=mode, trace="none",
                    timeout_s=120, out_dir=str(tmp_path / "o"))  # fmt: skip
    launch(cfg)
    out = tmp_path / "o"
    recvs = {int(k): (int(t0), int(t1), int(src), vals) for k, t0, t1, src, vals in _lines(out, "RECV", 5)}
    sends = {(int(r), int(tag)): (int(t0), int(t1)) for r, tag, t0, t1 in _lines(out, "SEND", 4)}
    assert [(recvs[k][2], recvs[k][3]) for k in (0, 1)] == [(2, "[2, 2, 2, 2]"), (1, "[1, 1, 1, 1]")]
    assert sends[(2, 0)][0] < sends[(1, 0)][0]  # rank 2's send is the earlier in virtual time
    assert _lines(out, "IRECV", 2) == [["1", "[10, 10, 10, 10]"]]
    if mode == "real":  # 0 network bytes: each ends at the later entry, on both sides
        assert recvs[0][1] == sends[(2, 0)][1] == max(recvs[0][0], sends[(2, 0)][0])
        assert recvs[1][1] == sends[(1, 0)][1] == max(recvs[1][0], sends[(1, 0)][0])
    else:  # timed as an NCCL send/recv of 32 B: after both sides' entries
        assert recvs[0][1] > max(recvs[0][0], sends[(2, 0)][0])
        assert recvs[1][1] > max(recvs[1][0], sends[(1, 0)][0], recvs[0][1])
