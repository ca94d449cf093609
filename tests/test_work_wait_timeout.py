"""`Work.wait(timeout)` as torch's: a wait the coordinator has not answered within `timeout` of the host's wall time
raises what torch's own gloo work raises then (c10d's Work::wait: `RuntimeError("Operation timed out!")`, read from
torch below, not restated); the work still completes, and a later wait on it returns its simulated end."""

from __future__ import annotations

import datetime
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from torch._C._distributed_c10d import ProcessGroupGloo

from bridge.run import CosimRun
from phantora.collectives.spec import AlgoOptions
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.topology.generators import leaf_spine

RANK = r"""
import sys, time
from bridge.client import RankClient, WaitTimedOut

c = RankClient.from_env()
MB = 1 << 20


def coll(seq, t):
    return c.collective(group=[0, 1], seq=seq, kind="all_reduce", nbytes=8 * MB, dtype="bf16", root=None, t_issue_ns=t)


if c.rank == 1:
    time.sleep(1.5)  # wall time: rank 0's first waits cannot be answered before rank 1 issues its half
h = coll(0, 0)
out = {"timed_out": []}
if c.rank == 0:
    for bound in (0.3, 0.2):  # the second wait gives up too: the answer the first one gave up on is still owed
        t0 = time.monotonic()
        try:
            c.wait(h, deadline=t0 + bound)
        except WaitTimedOut:
            out["timed_out"].append(time.monotonic() - t0)
out["t_done"] = c.wait(h)
out["t_next"] = c.wait(coll(1, out["t_done"]), deadline=time.monotonic() + 60)  # a deadline met
c.finish(out["t_next"], out)
c.close()
"""


def torch_gloo_timeout() -> tuple[type, str]:
    """The error torch's gloo work raises when a wait passes its timeout: rank 0 of a 2-rank group waits on an
    all-reduce that rank 1 joins only afterwards."""
    store = torch.distributed.HashStore()
    made: list[ProcessGroupGloo] = []

    def group(rank: int) -> None:
        opts = ProcessGroupGloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = datetime.timedelta(seconds=30)
        made.append(ProcessGroupGloo(store, rank, 2, opts))

    peer = threading.Thread(target=group, args=(1,))
    peer.start()
    group(0)
    peer.join()
    pg0, pg1 = sorted(made, key=lambda g: g.rank())
    work = pg0.allreduce([torch.ones(2)])
    try:
        work.wait(datetime.timedelta(seconds=0.2))
    except Exception as exc:  # noqa: BLE001 - what torch raises is the reference
        got = (type(exc), str(exc))
    else:
        raise AssertionError("torch's gloo work did not time out")
    pg1.allreduce([torch.ones(2)]).wait()
    work.wait()
    return got


@pytest.mark.parametrize("window", [0, 20_000])
def test_a_client_wait_past_its_deadline_raises_and_the_answer_comes_later(tmp_path: Path, window: int) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    star2 = leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us")
    res = CosimRun(
        star2,
        EngineSpec(window_ns=window),
        rank_cmd=[sys.executable, str(script)],
        algo=AlgoOptions(model="ideal"),
        timeout_s=60,
    ).run()
    # two waits gave up, each at its own bound (0.3 s, 0.2 s) of wall time, before rank 1 (asleep 1.5 s) issued
    late = res.ranks[0]["timed_out"]
    assert len(late) == 2 and 0.3 <= late[0] < 1.5 and 0.2 <= late[1] < 1.5
    # the all-reduce itself is not moved: the ideal model's 8 MiB on 2 ranks at 100 Gb/s, plus 2 latencies
    one = -(-8 * 2**20 * 8 * 10**9 // (100 * 10**9)) + 2 * 1000
    for r in (0, 1):
        assert res.ranks[r]["t_done"] == one
        # the next one, issued at its end (window mode: launched at most a window late)
        assert 2 * one <= res.ranks[r]["t_next"] <= 2 * one + window


SCRIPT = """
    import datetime, time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    x = torch.ones(4)
    if rank == 1:
        time.sleep(4)  # wall time: rank 0's wait cannot be answered before rank 1 issues its half
    work = dist.all_reduce(x, async_op=True)
    if rank == 0:
        t0 = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
            print("RESULT", "none", "none", 0.0, flush=True)
        except Exception as exc:
            print("RESULT", type(exc).__name__, repr(str(exc)).replace(" ", "_"), time.monotonic() - t0, flush=True)
        work.wait()  # no timeout: the all-reduce completes
        y = torch.ones(4)
        dist.all_reduce(y, async_op=True).wait(timeout=datetime.timedelta(seconds=120))  # a timeout met
        print("RESULT", float(x[0]), float(y[0]), flush=True)
    else:
        work.wait()
        dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
"""


@pytest.mark.slow  # 2 live ranks: 35-45 s wall on the shared machine (load 20); the client's part is checked fast above
def test_a_programs_wait_past_its_timeout_raises_torchs_error_and_the_work_completes(tmp_path: Path) -> None:
    kind, text = torch_gloo_timeout()
    script = tmp_path / "wait_timeout.py"
    script.write_text(textwrap.dedent(SCRIPT))
    star2 = leaf_spine(1, 2, 0, name="star2")
    rep = launch(RunConfig(str(script), topology=star2, nproc=2, trace="none", timeout_s=180, out_dir=tmp_path / "run"))
    got = [line.split()[1:] for line in rep.logs["rank 0"].splitlines() if line.startswith("RESULT")]
    assert got[0][:2] == [kind.__name__, repr(text).replace(" ", "_")], got
    assert 0.5 <= float(got[0][2]) < 3.5  # raised at its timeout, before rank 1 (asleep 4 s) issued
    assert got[1] == ["2.0", "2.0"]  # the all-reduce completed after all; the next wait met its timeout


def test_torchs_gloo_wait_past_its_timeout_raises_a_runtime_error() -> None:
    """The reference itself, fast: what the slow test holds phantora's wait to."""
    kind, text = torch_gloo_timeout()
    assert issubclass(kind, RuntimeError) and "timed out" in text
