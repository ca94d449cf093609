"""Waits the 2026-12-04 audit of blocking receives bounded (docs/status.md "Bad input and failure audit"): the ns-3
runner's output read while it may be stopped for good, a zygote home closed while a zygote is stopped, and the
questions put to the runner. Real processes and signals throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge import zygote
from phantora.errors import PhantoraError
from phantora.netsim import ns3_abi
from phantora.netsim.proc_watch import proc_state, watched_lines
from tests.proc_waits import wait_gone, wait_state


def _printer(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_a_silent_process_that_is_not_stopped_is_read_to_its_end() -> None:
    """Silent for three limits (sleeping: state S), then more lines, the last without a newline: every line."""
    proc = _printer("import sys, time; print('a\\nb', flush=True); time.sleep(3); sys.stdout.write('c\\nd')")
    try:
        assert list(watched_lines(proc, "the printer", stopped_s=1.0)) == ["a", "b", "c", "d"]
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_stopped_process_ends_the_reading_named_with_its_pid_and_state() -> None:
    proc = _printer("import time; print('a', flush=True); time.sleep(60)")
    try:
        lines = watched_lines(proc, "the printer", stopped_s=1.0)
        assert next(lines) == "a"
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(PhantoraError) as err:
            next(lines)
        assert 1.0 < time.monotonic() - t0 < 4.0  # the limit, plus a look every second
        assert str(err.value) == (
            f"the printer (pid {proc.pid}) has been stopped (state T: SIGSTOP or SIGTSTP; nothing resumed it) for 1 s"
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_home_closes_with_a_stopped_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped zygote holds the home's SIGTERM until resumed: the close waited for it without end; now it SIGKILLs
    it after CLOSE_WAIT_S and reaps it."""
    monkeypatch.setattr(zygote, "CLOSE_WAIT_S", 0.5)
    home = zygote.ZygoteHome()
    stand_in = subprocess.Popen(["sleep", "60"])  # a process of the home's, as its zygotes are
    (home.path / "z.pid").write_text(str(stand_in.pid))
    os.kill(stand_in.pid, signal.SIGSTOP)
    assert wait_state(proc_state, stand_in.pid, "T", 5.0) == "T"
    t0 = time.monotonic()
    home.close()
    assert time.monotonic() - t0 < 3.0
    assert wait_gone([stand_in.pid], 2.0) == [] and not home.path.exists()


def test_a_runner_that_does_not_answer_its_interface_question_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ns3_abi, "QUERY_TIMEOUT_S", 0.5)
    runner = tmp_path / "phantora-ns3-runner"
    runner.write_text("#!/bin/sh\nexec sleep 30\n")
    runner.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(PhantoraError, match=r"did not answer --interface-version within 0 s"):
        ns3_abi.check_runner(runner)
    assert time.monotonic() - t0 < 5.0


@pytest.mark.slow  # two decomposition workers importing ns-3
def test_a_worker_stopped_while_it_starts_ends_the_run_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decomposition worker stopped before its hello (in its ns-3 import) was waited for up to the start-up timeout
    (180 s); now for the silence limit, then named, and close() leaves no worker."""
    from test_decompose import SETTINGS, rail_dag, tiny

    import bridge.workers
    from bridge.workers import spawn_workers
    from phantora.netsim.decompose import WorkerDiedError
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    monkeypatch.setattr(bridge.workers, "WORKER_SILENCE_S", 2.0)
    topo = tiny()
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    packet = sim.packet
    try:
        victim = packet.workers[1]
        os.kill(victim.pid, signal.SIGSTOP)  # at once: it is still importing ns-3 (seconds)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"worker 1 \(pid {victim.pid}.*stopped \(state T.* for 2 s while"):
            sim.submit(rail_dag(topo), 0)
            sim.drain()
        assert time.monotonic() - t0 < 30.0  # worker 0's start on a loaded machine, then 2 s
    finally:
        sim.close()
    assert all(w.proc is not None and w.proc.poll() is not None for w in packet.workers)


class _Stand:
    """A local partition worker as `bridge.cut_watch.wait_workers` sees one (`proc`, `poll`, `describe`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def describe(self) -> str:
        return f"pid {self.proc.pid}"

    def last_words(self) -> str:
        return ""


def test_a_stopped_partition_worker_is_named_not_the_peer_that_gave_up_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, worker 0 SIGSTOPped 23 s into a partition=2 netsim run ended it 60.7 s later as "partition worker 1
    ... exited with code 1", the culprit only in its last words (no word from worker 0 at its barrier)."""
    from bridge.cut_watch import wait_workers
    from phantora.netsim import proc_watch

    monkeypatch.setattr(proc_watch, "STOPPED_S", 1.0)
    procs = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])]
    try:
        os.kill(procs[0].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(PhantoraError) as err:
            wait_workers([_Stand(p) for p in procs], timeout_s=60)
        assert time.monotonic() - t0 < 4.0
        stopped = "stopped (state T: SIGSTOP or SIGTSTP; nothing resumed it)"
        assert str(err.value) == f"partition worker 0 (pid {procs[0].pid}) has been {stopped} for 1 s"
        monkeypatch.setattr(proc_watch, "STOPPED_S", 60.0)  # the peer gives up first: it is named as the victim
        procs[1].kill()
        procs[1].wait(timeout=10)
        procs[1] = subprocess.Popen(["sh", "-c", "sleep 1.5; exit 1"])
        with pytest.raises(PhantoraError) as err:
            wait_workers([_Stand(p) for p in procs], timeout_s=60)
        assert str(err.value) == (
            f"partition worker 0 (pid {procs[0].pid}) is {stopped}: partition worker 1 (pid {procs[1].pid}) exited "
            "with code 1"
        )
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
