"""`Work.wait(timeout)` as ProcessGroupNCCL's (torch 2.13): a wait the coordinator has not answered within `timeout`
of the host's wall time raises `DistBackendError` with the watchdog's timeout text and aborts the call's communicator
(`WorkNCCL::wait`: `checkTimeout`, then `abort()` and `handleException`), so a later wait on the work raises it again
and a later call on the communicator raises NCCLComm's "NCCL communicator was aborted on rank R": each at once, none
blocks. The bridge's part: a client wait past its deadline is given up (`cancel`) and the rank runs on, while the
call still completes for the others. torch's texts are restated from its source (no GPU here to run NCCL)."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from bridge.run import CosimRun
from phantora.collectives.spec import AlgoOptions
from phantora.errors import PhantoraError
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
    for bound in (0.3, 0.2):  # the second wait gives up too: rank 1 has still not issued its half
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


@pytest.mark.parametrize("window", [0, 20_000])
def test_a_client_wait_past_its_deadline_gives_up_and_the_call_still_completes(tmp_path: Path, window: int) -> None:
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


AFTER = """
    import datetime, time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])  # a second communicator over the same two ranks
    x = torch.ones(4)
    if rank == 1:
        time.sleep(4)  # wall time: rank 0's wait cannot be answered before rank 1 issues its half
    work = dist.all_reduce(x, async_op=True)


    def attempt(what, call):
        t0 = time.monotonic()
        try:
            call()
            got = ["ok", "-"]
        except Exception as exc:
            got = [type(exc).__name__, str(exc).replace(" ", "~")]
        print("RESULT", what, *got, time.monotonic() - t0, flush=True)


    if rank == 0:
        attempt("timeout", lambda: work.wait(timeout=datetime.timedelta(seconds=0.5)))
        attempt("wait", work.wait)  # what a program does next: wait again, without a timeout,
        attempt("all_reduce", lambda: dist.all_reduce(torch.ones(4)))  # or call another collective,
        attempt("barrier", dist.barrier)  # or a barrier, on the aborted communicator
        y = torch.ones(4)
        attempt("other_group", lambda: dist.all_reduce(y, group=pair))  # another communicator works
        print("RESULT sums", float(y[0]), flush=True)
    else:
        work.wait()
        y = torch.ones(4)
        dist.all_reduce(y, group=pair)
        print("RESULT sums", float(x[0]), float(y[0]), flush=True)
    dist.destroy_process_group()  # and the program ends as usual
"""


def star2_run(tmp_path: Path, text: str, timeout_s: float = 180) -> dict[str, list[list[str]]]:
    """Run `text` live on 2 ranks of a one-switch fabric, bounded by `timeout_s` (start-up included: a hang fails);
    each rank's "RESULT ..." lines' fields."""
    script = tmp_path / "after_timeout.py"
    script.write_text(textwrap.dedent(text))
    star2 = leaf_spine(1, 2, 0, name="star2")
    cfg = RunConfig(str(script), topology=star2, nproc=2, trace="none", timeout_s=timeout_s, out_dir=tmp_path / "run")
    rep = launch(cfg)
    return {r: [ln.split()[1:] for ln in rep.logs[r].splitlines() if ln.startswith("RESULT")] for r in rep.logs}


WATCHDOG = "[Rank~0]~Watchdog~caught~collective~operation~timeout:~WorkNCCL(OpType=ALLREDUCE)~ran~for~"
ABORTED = "NCCL~communicator~was~aborted~on~rank~0.~~Original~reason~for~failure~was:~" + WATCHDOG


@pytest.mark.slow  # 2 live ranks: 30-40 s wall on the shared machine (load 15), its start-up most of it
def test_after_a_wait_past_its_timeout_every_call_on_its_communicator_raises_at_once(tmp_path: Path) -> None:
    got = star2_run(tmp_path, AFTER)
    rank0 = {line[0]: line[1:] for line in got["rank 0"]}
    kind, text, took = rank0["timeout"]
    assert kind == "DistBackendError" and text.startswith(WATCHDOG), text
    assert "all_reduce~'all_reduce#0'~(16~B,~ranks~[0,~1])" in text  # phantora's account names the call
    assert 0.5 <= float(took) < 3.5  # raised at its timeout, before rank 1 (asleep 4 s) issued its half
    assert rank0["wait"][:2] == ["DistBackendError", text]  # the same error again (WorkNCCL::wait rethrows it)
    for call in ("all_reduce", "barrier"):
        kind, aborted, _ = rank0[call]
        assert kind == "DistBackendError" and aborted.startswith(ABORTED), aborted
    for call in ("wait", "all_reduce", "barrier"):  # each at once: nothing waits for rank 1
        assert float(rank0[call][2]) < 1.0, (call, rank0[call])
    assert rank0["other_group"][0] == "ok" and rank0["sums"] == ["2.0"]
    # rank 1: the all-reduce rank 0 gave up on completes for it (rank 0's half was issued; NCCL would hang there
    # until rank 1's own watchdog timeout), then the pair's
    assert got["rank 1"] == [["sums", "2.0", "2.0"]]


UNCAUGHT = """
    import datetime, time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    x = torch.ones(4)
    if dist.get_rank() == 1:
        time.sleep(600)  # never joins within the run's bound
    work = dist.all_reduce(x, async_op=True)
    work.wait(timeout=datetime.timedelta(seconds=0.5))  # rank 0 does not catch it
    dist.destroy_process_group()
"""


@pytest.mark.slow  # 2 live ranks: 15-25 s wall on the shared machine (load 15)
def test_a_wait_past_its_timeout_that_the_program_does_not_catch_ends_the_run_naming_it(tmp_path: Path) -> None:
    """The run ends as soon as rank 0 dies of it (rank 1 asleep 600 s is stopped), non-zero, naming rank 0 and the
    error, well within the run's bound (a hang would end at the bound, with another message)."""
    t0 = time.monotonic()
    with pytest.raises(PhantoraError) as err:
        star2_run(tmp_path, UNCAUGHT, timeout_s=240)
    text = str(err.value)
    assert "rank 0" in text and "exited with code 1" in text and "did not finish" not in text, text
    assert "DistBackendError: [Rank 0] Watchdog caught collective operation timeout" in text, text
    assert time.monotonic() - t0 < 200


GIVES_UP = """
    import datetime, time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    x = torch.ones(4)
    if dist.get_rank() == 1:
        time.sleep(4)  # wall time: rank 0's wait cannot be answered before rank 1 issues its half
    work = dist.all_reduce(x, async_op=True)
    if dist.get_rank() == 0:
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
        except dist.DistBackendError:
            pass  # rank 0 gives up: it destroys its group and ends
    else:
        work.wait()
        dist.all_reduce(torch.ones(4))  # the next step's: rank 0 is gone
    dist.destroy_process_group()
"""


@pytest.mark.slow  # 2 live ranks: 20-30 s wall on the shared machine (load 15)
def test_a_rank_that_gave_up_a_wait_and_left_is_named_by_the_call_it_left_unjoined(tmp_path: Path) -> None:
    """Rank 0 catches the error, destroys its group and ends; rank 1's next all-reduce cannot complete: the run
    fails at once, naming rank 0 and the wait it gave up (not the run's 240 s bound)."""
    with pytest.raises(PhantoraError) as err:
        star2_run(tmp_path, GIVES_UP, timeout_s=240)
    text = str(err.value)
    assert "missing participant: rank 0 finished" in text and "seq 1" in text, text
    assert "it gave up its wait on all_reduce(16 B) on group [0, 1] seq 0" in text, text
