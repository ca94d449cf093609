"""A rank stopped or wedged mid-run ends the run after the silence limit, named with its pid and state; a rank that
waits or computes, however long, never does (bridge/rank_beat.py, bridge/rank_watch.py).

Before, a SIGSTOPped rank held `phantora run` until `--timeout` (2026-12-03 audit: still running 136 s later): the
coordinator cannot judge a rank by its silence, since a rank may compute for minutes without a word. Real processes,
signals and runs throughout (a real coordinator and rank processes over ZeroMQ, as a user's run has them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge import rank_beat
from bridge.errors import BridgeError
from bridge.rank_watch import RankWatch, proc_state
from bridge.run import CosimRun
from bridge.supervisor import Child, alive_pids
from phantora.topology.generators import leaf_spine
from tests.proc_waits import wait_gone

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import ctypes, sys, time
from bridge.client import RankClient

mode, limit = sys.argv[1], float(sys.argv[2])
c = RankClient.from_env()
r = c.rank


def all_reduce(seq, t):
    h = c.collective(group=list(range(c.world)), seq=seq, kind="all_reduce", nbytes=1 << 20, dtype="bf16", root=None,
                     t_issue_ns=t)
    return c.wait(h)


t = all_reduce(0, 0)
out = {}
if mode == "loop":  # until the test stops rank 1
    for i in range(1, 100_000):
        t = all_reduce(i, t)
        time.sleep(0.05)
elif mode == "wedge" and r == 1:
    ctypes.PyDLL(None).sleep(600)  # a C call that holds the GIL and never returns: no beat, no CPU time
elif mode == "busy":
    if r == 0:
        time.sleep(3 * limit)  # the GIL released, no CPU time: its beat goes on (then it waits for rank 1)
    else:  # a C loop holding the GIL, no beat, CPU time: about 2.5 limits of CPU, from a calibration
        c0 = time.process_time()
        sum(range(1_000_000))
        n = int(1_000_000 * 2.5 * limit / max(time.process_time() - c0, 1e-4))
        c0 = time.process_time()
        sum(range(n))
        out["held_gil_cpu_s"] = time.process_time() - c0
t = all_reduce(1, t)
c.finish(t, out)
c.close()
"""


@pytest.fixture
def rank_script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    return path


def star2():
    return leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us")


def _run(script: Path, mode: str, limit: float) -> CosimRun:
    cmd = [sys.executable, str(script), mode, str(limit)]
    return CosimRun(star2(), rank_cmd=cmd, peer_timeout_s=limit, timeout_s=120, cwd=str(ROOT))


def test_a_stopped_rank_ends_the_run_named_with_its_state(rank_script: Path) -> None:
    """SIGSTOP of rank 1 while both ranks loop on all-reduces: the run ends within the limit and a few seconds,
    `rank 1 (pid N) has made no progress for 2 s: stopped (state T ...)`, code timeout, no process left."""
    limit = 2.0
    run = _run(rank_script, "loop", limit)
    stopped: dict[str, float] = {}

    def stopper() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len([c for c in run.children if c.role == "rank"]) < 2:
            time.sleep(0.05)
        time.sleep(1.0)
        rank1 = next(c for c in run.children if c.role == "rank" and c.rank == 1)
        stopped["t"], stopped["pid"] = time.monotonic(), rank1.pid
        os.kill(rank1.pid, signal.SIGSTOP)

    th = threading.Thread(target=stopper)
    th.start()
    with pytest.raises(BridgeError) as err:
        run.run()
    th.join()
    ended = time.monotonic() - stopped["t"]
    text = str(err.value)
    assert text.startswith(f"rank 1 (pid {int(stopped['pid'])}) has made no progress for 2 s: stopped (state T"), text
    assert err.value.code == "timeout" and err.value.rank == 1
    # the last beat up to 1 s before the stop, looks every second; then the ranks' 2 s and stop_all's 1 s grace
    assert limit - 1.0 <= ended < limit + 7.0, ended
    assert alive_pids([c.pid for c in run.children]) == []


def test_a_stopped_fork_server_ends_the_run(tmp_path: Path) -> None:
    """The ranks' fork server stopped mid-run (it would reap no rank, so a rank's death would go unseen): named."""
    (tmp_path / "liverank.py").write_text(RANK)
    cmd = [sys.executable, "-m", "liverank", "loop", "2.0"]
    run = CosimRun(
        star2(), rank_cmd=cmd, rank_preload=("json",), env={"PYTHONPATH": str(tmp_path)}, peer_timeout_s=2.0,
        timeout_s=120,
    )  # fmt: skip

    def stopper() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len([c for c in run.children if c.role == "rank"]) < 2:
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(next(c for c in run.children if c.role == "forkserver").pid, signal.SIGSTOP)

    th = threading.Thread(target=stopper)
    th.start()
    with pytest.raises(
        BridgeError, match=r"^the fork server \(pid \d+\) has made no progress for 2 s: stopped \(state T"
    ):
        run.run()
    th.join()
    assert alive_pids([c.pid for c in run.children]) == []


def test_a_wedged_rank_ends_the_run(rank_script: Path) -> None:
    """Rank 1 blocks in a C call holding the GIL (its process sleeping: no beat, no CPU time): named wedged, state S;
    rank 0, waiting for it meanwhile, is not."""
    run = _run(rank_script, "wedge", 2.0)
    with pytest.raises(BridgeError, match=r"^rank 1 \(pid \d+\) has made no progress for 2 s: wedged: .*state S"):
        run.run()
    assert alive_pids([c.pid for c in run.children]) == []


@pytest.mark.slow  # about 4 CPU s of a C loop by design (18-24 s wall at load 20)
def test_ranks_waiting_or_computing_past_the_limit_are_never_stopped(rank_script: Path) -> None:
    """Rank 0 sleeps 3 limits (the GIL released: it beats), rank 1 holds the GIL in one C loop for about 2.5 limits
    of CPU (no beat, CPU time grows), then both all-reduce: the run completes, each rank at the all-reduce's time."""
    limit = 1.5
    res = _run(rank_script, "busy", limit).run()
    assert res.ranks[1]["held_gil_cpu_s"] > 2 * limit  # the premise: no beat for longer than the limit
    assert sorted(res.finish_ns) == [0, 1]


def test_the_watch_judges_a_process_before_and_after_its_beat_starts(tmp_path: Path) -> None:
    """Before its beat starts (a rank's imports), a process counts as silent only while it is stopped; one that beats
    and is stopped is named by the rank its beat file gives when it is not a child (`others`: ranks a program
    started itself). The limit is twice the beat's period: a beat may come late by scheduling, never by a period."""
    limit = 2 * rank_beat.BEAT_S
    quiet = subprocess.Popen(["sleep", "60"])  # a rank not beating yet, as in its imports
    code = f"from bridge import rank_beat; rank_beat.start({str(tmp_path)!r}, 5); import time; time.sleep(60)"
    beating = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    child = Child("rank", 3, quiet, tmp_path / "rank3.log")
    try:
        deadline = time.monotonic() + 30
        while not rank_beat.beat_file(tmp_path, beating.pid).exists():
            assert time.monotonic() < deadline, "no beat file"
            time.sleep(0.05)
        children, others = RankWatch(tmp_path, limit), RankWatch(tmp_path, limit)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 * limit:  # three limits, both silent towards the run, neither stopped
            assert children.check([child]) is None and others.check([], others=True) is None
            time.sleep(0.1)
        os.kill(beating.pid, signal.SIGSTOP)
        os.kill(quiet.pid, signal.SIGSTOP)
        found: dict[int, tuple[int | None, str]] = {}
        t0 = time.monotonic()
        while len(found) < 2 and time.monotonic() - t0 < 5 * limit:
            for hit in (children.check([child]), others.check([], others=True)):
                if hit is not None:
                    found[hit[0]] = hit[1:]
            time.sleep(0.1)
        t_stopped = "stopped (state T: SIGSTOP or SIGTSTP; nothing resumed it)"
        assert found == {
            quiet.pid: (3, f"rank 3 (pid {quiet.pid}) has made no progress for {limit:.0f} s: {t_stopped}"),
            beating.pid: (5, f"rank 5 (pid {beating.pid}) has made no progress for {limit:.0f} s: {t_stopped}"),
        }
        assert proc_state(quiet.pid) == "T"
    finally:
        for p in (quiet, beating):
            p.kill()
            p.wait(timeout=10)


def test_a_wedged_rank_of_an_isolated_job_ends_only_its_job(rank_script: Path) -> None:
    """Several jobs, each alone in failure: the wedged rank is killed and its job fails saying why; the other job
    completes."""
    from bridge.jobs import JobProcs

    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    jobs = [
        JobProcs("a", 2, [sys.executable, str(rank_script), "plain", "2.0"]),
        JobProcs("b", 2, [sys.executable, str(rank_script), "wedge", "2.0"]),
    ]
    res = CosimRun(topo, jobs=jobs, all_or_nothing=False, peer_timeout_s=2.0, timeout_s=120, cwd=str(ROOT)).run()
    assert [j["status"] for j in res.jobs] == ["complete", "failed"]
    text = res.jobs[1]["error"]["text"]
    assert "rank 1 of job b (pid " in text and "has made no progress for 2 s: wedged" in text, text
    assert "it was killed (SIGKILL)" in text


def test_a_server_stopped_while_it_writes_the_traces_is_named_without_waiting_for_the_bound(tmp_path: Path) -> None:
    """After the outcome the run waits up to TRACE_WAIT_S (600 s) for the network server to write the fabric traces;
    one stopped there is named after the peer timeout instead."""
    run = CosimRun(
        star2(), rank_cmd=["true"], out_dir=tmp_path / "out", engine_in_coordinator=False, peer_timeout_s=1.0
    )
    stand_in = subprocess.Popen(["sleep", "60"])  # the server's process, stopped while it writes
    try:
        os.kill(stand_in.pid, signal.SIGSTOP)
        run.run_dir = tmp_path
        run.children = [Child("server", None, stand_in, tmp_path / "server.log")]
        t0 = time.monotonic()
        with pytest.raises(BridgeError) as err:
            run._await_server_traces()
        assert time.monotonic() - t0 < 5.0
        assert str(err.value) == (
            f"the network server (pid {stand_in.pid}) has made no progress for 1 s: stopped (state T: SIGSTOP or "
            "SIGTSTP; nothing resumed it) while it wrote the fabric traces; the run was stopped"
        )
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)


SPAWNER = r"""
import os, subprocess, sys
procs = [subprocess.Popen([sys.executable, sys.argv[1], "loop", "2.0"], env={**os.environ, "RANK": str(r)})
         for r in range(int(os.environ["WORLD_SIZE"]))]
sys.exit(max(p.wait() for p in procs))
"""


def test_a_stopped_rank_that_a_program_started_itself_is_named_by_its_beat(rank_script: Path, tmp_path: Path) -> None:
    """`--spawn`: the ranks are the program's children, not the launcher's; the launcher finds them by their beat
    files, and one stopped is named with the rank its file gives."""
    (tmp_path / "spawner.py").write_text(SPAWNER)
    cmd = [sys.executable, str(tmp_path / "spawner.py"), str(rank_script)]
    run = CosimRun(star2(), spawner_cmd=cmd, peer_timeout_s=2.0, timeout_s=120, cwd=str(ROOT))
    stopped: dict[str, int] = {}

    def stopper() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            beats = list((run.run_dir / rank_beat.BEATS_DIR).glob("*")) if run.run_dir is not None else []
            one = [p for p in beats if p.read_text() == '{"rank": 1}']
            if len(beats) == 2 and one:
                time.sleep(1.0)
                stopped["pid"] = int(one[0].name)
                os.kill(stopped["pid"], signal.SIGSTOP)
                return
            time.sleep(0.05)

    th = threading.Thread(target=stopper)
    th.start()
    with pytest.raises(BridgeError) as err:
        run.run()
    th.join()
    assert str(err.value).startswith(f"rank 1 (pid {stopped['pid']}) has made no progress for 2 s: stopped (state T")
    assert wait_gone([c.pid for c in run.children] + [stopped["pid"]], 5.0) == []  # SIGKILLed, not yet gone
