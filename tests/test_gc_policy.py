"""The cyclic GC's run policy (phantora/netsim/gc_pause.py): on in the coordinator and the network server of a live
run, on in the `phantora` program, and under it garbage cycles are still freed."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from bridge.run import CosimRun
from phantora.netsim.gc_pause import RUN_THRESHOLDS
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parent.parent
REPLAY = [sys.executable, "-m", "phantora.egraph.replay_rank"]


def in_child(code: str) -> str:
    """Run `code` in a fresh interpreter (the policy is process-wide: not this one's); its stdout."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout


def test_the_coordinator_and_the_network_server_run_under_the_policy(tmp_path: Path) -> None:
    """Each process logs the collector's state as `gc` reports it once set-up is done."""
    wl = tmp_path / "wl.json"
    wl.write_text('{"name": "ar", "op": [{"name": "ar", "kind": "all_reduce", "bytes": 1000000, "ranks": "0-1"}]}')
    res = CosimRun(
        leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us"),
        engine_in_coordinator=False,
        rank_cmd=[*REPLAY, str(wl)],
        timeout_s=120,
    ).run()
    for role in ("coordinator", "server"):
        line = next(ln for ln in res.logs[role].splitlines() if "cyclic GC:" in ln)
        assert f"the run policy, thresholds {RUN_THRESHOLDS}" in line, (role, line)
        frozen = int(line.rsplit(", ", 1)[1].split()[0].replace(",", ""))
        assert frozen > 10_000, (role, line)  # the modules and the engine at least


def test_the_phantora_program_runs_under_the_policy_and_a_caller_keeps_its_own() -> None:
    """`phantora` as a program applies the policy; `main(argv)` called from Python leaves the caller's collector."""
    probe = "import gc, sys; from phantora import cli; "
    args = "['replay', 'none.toml', '--topology', 'testbed16']"  # (the policy is set before the command runs)
    program = in_child(probe + f"sys.argv = ['phantora', *{args}]; cli.main(); print(gc.get_threshold())")
    assert program.splitlines()[-1] == str(RUN_THRESHOLDS)
    called = in_child(probe + f"cli.main({args}); print(gc.get_threshold())")
    assert called.splitlines()[-1] == str(gc.get_threshold())  # (CPython's, as this process has it)


def test_garbage_cycles_are_freed_under_the_policy() -> None:
    """Half a million garbage cycles made under the policy (inside `gc_paused` blocks, as the engine's events run):
    the collector stays on and frees them, so the objects it tracks stay bounded by a few thresholds' worth."""
    code = """
import gc
from phantora.netsim.gc_pause import gc_paused, use_run_policy, RUN_THRESHOLDS
use_run_policy()
base = len(gc.get_objects())
most = 0
for i in range(1_000):
    with gc_paused():
        assert gc.isenabled()
        for _ in range(500):
            a = []; a.append(a)
    if i % 25 == 0:
        most = max(most, len(gc.get_objects()) - base)
print(most, sum(s["collected"] for s in gc.get_stats()))
"""
    most, collected = map(int, in_child(code).split())
    assert most < 3 * RUN_THRESHOLDS[0]
    assert collected > 500_000 - 2 * RUN_THRESHOLDS[0]  # all but the last threshold's worth, not yet due
