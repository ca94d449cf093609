"""A rank stopped by the supervisor's SIGTERM writes every thread's stack to its log (phantora/runtime/stop_stacks.py),
then ends as SIGTERM ends a process: a run stopped past its bound names where each rank stood. Before, a rank blocked
in a call that never returns (gloo's connect, 11ff07d's hang) left an empty log."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

RANK = """
    import os, sys, threading, time
    from phantora.runtime import stop_stacks

    def connect_that_never_returns():
        threading.Event().wait()

    stop_stacks.dump_stacks_when_stopped()
    threading.Thread(target=connect_that_never_returns, daemon=True).start()
    child = os.fork()
    if child == 0:  # a forked worker: SIGTERM ends it without a word
        print("forked\\n", end="", flush=True)  # past fork's hooks, which drop the handler (one write: see below)
        time.sleep(60)
        os._exit(0)
    print(f"{child}\\n", end="", flush=True)  # one write: unbuffered, print(child) wrote the newline apart
    time.sleep(60)  # the rank's own thread, waiting
"""


def test_a_rank_stopped_by_sigterm_writes_every_threads_stack_and_ends() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(RANK)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = {proc.stdout.readline().strip() for _ in range(2)}  # the threads have started, the child has forked
    (child,) = (int(x) for x in lines if x != "forked")
    try:
        subprocess.run(["kill", "-TERM", str(child)], check=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # it ends as SIGTERM ends a process
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert "in connect_that_never_returns" in err  # the blocked thread, named by its function
    assert "Current thread" in err and "in <module>" in err  # the rank's own thread, at its wait
    assert err.count("in <module>") == 1  # the forked child wrote nothing


def test_a_rank_whose_session_ended_is_stopped_without_a_word() -> None:
    """After its session ended (bootstrap: the results are with the coordinator) a rank still tearing down when the
    supervisor stops it (a completed run's ranks get a few seconds) ends as SIGTERM ends a process, and its log
    holds no stack: before, "Stack (most recent call first): <no Python frame>" closed a successful run's output."""
    rank = "from phantora.runtime import stop_stacks; import time\n"
    rank += "stop_stacks.dump_stacks_when_stopped(); stop_stacks.quiet_when_stopped(); print('ended', flush=True)\n"
    rank += "time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", rank], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline() == "ended\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
    assert proc.stderr.read() == ""
