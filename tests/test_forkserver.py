"""Ranks forked by the fork server (bridge/forkserver.py): same results, same failure handling.

The references are runs of the same script with every rank a fresh interpreter, and the failure
guarantees of docs/bridge.md: a dead rank ends the run naming it, within seconds, and no process
outlives the run, not even when the launcher itself is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_runtime_e2e import star

from bridge.errors import BridgeError
from bridge.forkclient import ForkServer
from bridge.run import CosimRun
from bridge.supervisor import alive_pids
from bridge.zygote import HOME_ENV
from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]

LOOP = """
    import os, sys, torch, torch.distributed as dist
    out = sys.argv[1]
    dist.init_process_group()
    rank = dist.get_rank()
    with open(f"{out}/pid{rank}.tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.rename(f"{out}/pid{rank}.tmp", f"{out}/pid{rank}")
    while True:                      # every rank keeps training
        dist.all_reduce(torch.ones(4))
"""


def loop_script(tmp_path: Path) -> Path:
    path = tmp_path / "loop.py"
    path.write_text(textwrap.dedent(LOOP))
    return path


def wait_pids(tmp_path: Path, n: int, timeout_s: float = 90.0) -> list[tuple[int, int]]:
    """(pid, parent pid) of each of `n` ranks, once all have written them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((tmp_path / f"pid{r}").exists() for r in range(n)):
            pairs = [(tmp_path / f"pid{r}").read_text().split() for r in range(n)]
            return [(int(a), int(b)) for a, b in pairs]
        time.sleep(0.05)
    raise AssertionError("the ranks did not start")


def test_forked_ranks_give_the_results_of_fresh_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked from the session's zygote (tests/conftest.py), from a fork server of the run's own, or fresh."""

    def run(fork: bool):
        cfg = RunConfig(str(ROOT / "examples" / "gpt_ddp.py"), ["--steps", "2"], star(2), nproc=2, trace="none")
        cfg.fork_server, cfg.timeout_s = fork, 300
        return launch(cfg)

    zygote = run(True)
    monkeypatch.delenv(HOME_ENV)
    forked, fresh = run(True), run(False)
    for a in (zygote, forked):
        assert [s["time_ns"] for s in a.summary["steps"]] == [s["time_ns"] for s in fresh.summary["steps"]]
        assert a.logs["rank 0"] == fresh.logs["rank 0"]  # the losses: the same training, bit for bit
        assert a.logs["rank 1"] == fresh.logs["rank 1"]
        assert "forkserver" in a.logs
        # forked ranks share the imported modules' pages: less host memory once split among sharers
        assert 0 < a.summary["pss_mb_total"] < 0.7 * fresh.summary["pss_mb_total"]
    assert "forkserver" not in fresh.logs


@pytest.mark.parametrize("fork", [True, False])
def test_killing_a_rank_ends_the_run_naming_it_not_its_victim(tmp_path: Path, fork: bool) -> None:
    """Rank 1 is killed inside its all-reduces; rank 0's gloo then fails too ("Connection reset by
    peer"), often before the launcher has seen rank 1 die: the run must still name rank 1."""
    killed: dict[str, float] = {}
    found: list[tuple[int, int]] = []

    def killer() -> None:
        found.extend(wait_pids(tmp_path, 2))
        time.sleep(0.5)
        killed["t"] = time.monotonic()
        os.kill(found[1][0], signal.SIGKILL)

    th = threading.Thread(target=killer)
    th.start()
    with pytest.raises(BridgeError) as err:
        launch(
            RunConfig(str(loop_script(tmp_path)), [str(tmp_path)], star(2), nproc=2, timeout_s=120, fork_server=fork)
        )
    ended = time.monotonic()
    th.join()
    assert ended - killed["t"] < 5.0
    assert "rank 1" in str(err.value) and "SIGKILL" in str(err.value)
    parent = found[0][1]
    assert found[1][1] == parent and (parent != os.getpid()) == fork  # the fork server's children, or ours
    assert alive_pids([pid for pid, _ in found] + ([parent] if fork else [])) == []


def test_killing_the_launcher_leaves_no_process(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from phantora.cli import main; sys.exit(main())",
        "run",
        "-t",
        "star8",
        "--nproc",
        "2",
        "-q",
    ]
    cmd += ["--timeout", "120", str(loop_script(tmp_path)), str(tmp_path)]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = wait_pids(tmp_path, 2)
    finally:
        launcher.kill()
        launcher.wait()
    left = [pid for pid, _ in pids] + [pids[0][1]]
    deadline = time.monotonic() + 5.0
    while alive_pids(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_pids(left) == []


@pytest.mark.parametrize("zygote", [True, False])
def test_a_fork_server_that_cannot_start_is_named(monkeypatch: pytest.MonkeyPatch, zygote: bool) -> None:
    if not zygote:
        monkeypatch.delenv(HOME_ENV)
    run = CosimRun(
        star(2), rank_cmd=[sys.executable, "-m", "phantora.egraph.replay_rank"], rank_preload=("no_such_module_x",)
    )
    with pytest.raises(
        BridgeError, match=r"(?s)the fork server .*exited with code 1 during start-up.*no_such_module_x"
    ):
        run.run()
    assert alive_pids([c.pid for c in run.children]) == []


CHILD = """
    import multiprocessing, os, sys, time, torch, torch.distributed as dist
    out = sys.argv[1]
    dist.init_process_group()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(1000,))
    child.start()                    # a process of the rank's own, as a DataLoader worker is
    with open(f"{out}/pid{dist.get_rank()}.tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(f"{out}/pid{dist.get_rank()}.tmp", f"{out}/pid{dist.get_rank()}")
    while True:
        dist.all_reduce(torch.ones(4))
"""


def test_sigterm_to_the_launcher_stops_every_process(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    cmd = [sys.executable, "-c", "import sys; from phantora.cli import main; sys.exit(main())", "run", "-t", "star8"]
    cmd += ["--nproc", "2", "-q", "--timeout", "120", str(script), str(tmp_path)]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        pids = wait_pids(tmp_path, 2)
    finally:
        launcher.terminate()
        _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 143 and "terminated" in err
    left = [pid for pair in pids for pid in pair]  # the ranks and the processes they started
    assert alive_pids(left) == []


def test_a_fork_server_slower_than_the_silence_limit_does_not_end_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server imports its preload before it can fork the first rank; on a loaded machine that takes
    longer than the coordinator's silence limit. The launcher heartbeats while it waits, so the run goes on. (A
    zygote's run waits for its imports before the coordinator starts: the run's own fork server is tested.)"""
    monkeypatch.delenv(HOME_ENV)
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(6.0)\n")
    script = tmp_path / "one.py"
    script.write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group()\ndist.all_reduce(torch.ones(4))\n"
    )
    run = CosimRun(
        star(2),
        rank_cmd=[sys.executable, "-m", "phantora.runtime.bootstrap", str(script)],
        rank_preload=("slow_import", "phantora.runtime.bootstrap"),  # the ranks' torch imported once, by the server
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        peer_timeout_s=3.0,  # half the preload's time: without the launcher's heartbeats the coordinator leaves
        timeout_s=120,
    )
    result = run.run()
    assert "forkserver" in result.logs
    assert result.startup_s > 0


PRELOADED = "class Preloaded:\n    pass\n\n\nKEPT = [Preloaded() for _ in range(1000)]\n"
PROBE = """
    import gc, json, sys
    import frozen_a, frozen_b
    made = [frozen_a.Preloaded()]
    walked = {id(o) for o in gc.get_objects()}  # the objects of the collector's generations
    seen = {name: id(obj) in walked for name, obj in (("a", frozen_a.KEPT), ("b", frozen_b.KEPT), ("made", made))}
    with open(sys.argv[1], "w") as f:
        json.dump({**seen, "frozen": gc.get_freeze_count()}, f)
"""


def test_a_forked_ranks_collector_never_walks_the_preloads_before_triton(tmp_path: Path) -> None:
    """The server freezes what its preloads made before it forks (gc.freeze), up to the first preload that loads
    triton (whose bindings report every instance still alive at exit as a leak): a rank's collections, the last one
    at its exit included, pass over those objects; what it makes itself, and the preloads' from triton on, they walk."""
    (tmp_path / "frozen_a.py").write_text(PRELOADED)
    (tmp_path / "frozen_b.py").write_text(PRELOADED)
    (tmp_path / "triton.py").write_text(PRELOADED)  # stands for triton: the first preload after it is not frozen
    (tmp_path / "frozen_probe.py").write_text(textwrap.dedent(PROBE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    seen = {}
    for preload in (("frozen_a", "frozen_b"), ("frozen_a", "triton", "frozen_b")):
        server = ForkServer.start(sys.executable, preload, env, tmp_path / "server.log")
        try:
            out = tmp_path / f"seen{len(preload)}.json"
            rank = server.fork(0, "frozen_probe", [str(out)], env, tmp_path / "rank0.log", None)
            assert rank.proc.wait(timeout=60) == 0, (tmp_path / "rank0.log").read_text()
        finally:
            server.close()
            server.child.proc.wait(timeout=30)
        seen[len(preload)] = json.loads(out.read_text())
    # each KEPT list and its 1000 instances: frozen before triton (not walked), collectable from it on
    assert {k: seen[2][k] for k in ("a", "b", "made")} == {"a": False, "b": False, "made": True}
    assert {k: seen[3][k] for k in ("a", "b", "made")} == {"a": False, "b": True, "made": True}
    assert seen[2]["frozen"] >= 2 * 1001 and seen[3]["frozen"] >= 1001
