"""The coordinator and the network server forked from a zygote (bridge/warm_start.py): what a fresh interpreter
would have been, the same results, the same supervision.

The references are the same processes started as `python -m`, as a run without a zygote home starts them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_bridge_run import RANK_SCRIPT, star

from bridge import warm_start
from bridge.errors import BridgeError
from bridge.forkclient import ForkedProc
from bridge.run import CosimRun
from bridge.supervisor import alive_pids
from bridge.zygote import HOME_ENV, ZygoteHome

ROOT = Path(__file__).resolve().parents[1]
REPLAY = [sys.executable, "-m", "phantora.egraph.replay_rank"]

PROBE = """
    import json, os, signal, sys
    from bridge.launcher_pid import launcher_pid

    if __name__ == "__main__":
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1)
        fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd != "3"]  # listdir's
        print(json.dumps({
            "argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path, "flags": str(sys.flags),
            "launcher": launcher_pid(), "signals": {s.name: str(signal.getsignal(s)) for s in sigs},
            "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
            "leader": os.getpgid(0) == os.getsid(0) == os.getpid(), "umask": os.umask(0o22),
            "fds": sorted(os.path.basename(f) for f in fds if not f.startswith("/proc")),
            "stdin": os.readlink("/proc/self/fd/0"), "main": sys.modules["__main__"].__file__,
        }))
        print("to stderr", file=sys.stderr)
        sys.exit(7)
"""


def probe(tmp_path: Path, env: dict[str, str], log: Path) -> tuple[dict[str, Any], int, bool]:
    """Start the probe as a run's coordinator would be: what it saw, its exit code, and whether it was forked."""
    child, forker = warm_start.start(
        "coordinator", "warm_probe", ["--setup", "x", "--transport", "ipc"], sys.executable, env, log, None, tmp_path
    )
    try:
        code = child.proc.wait(timeout=120)
    finally:
        if forker is not None:
            forker.close()
    out, err = log.read_text().splitlines()
    assert err == "to stderr"
    return json.loads(out), code, isinstance(child.proc, ForkedProc)


def test_a_forked_server_sees_what_a_fresh_interpreter_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """argv, environment (the run token too), directory, sys.path, flags, signal handlers and mask, session, umask,
    open files, stdin, the launcher it watches and its exit code: all those of `python -m` (both logs are named
    `probe.log`, in two directories, so the open files compare by name)."""
    (tmp_path / "warm_probe.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.chdir(tmp_path)  # `python -m` finds the probe in its directory; so does the zygote of this directory
    env = {**os.environ, "PHANTORA_TOKEN": "t0k3n", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with ZygoteHome() as home:
        forked, forked_code, was_forked = probe(tmp_path, {**env, HOME_ENV: str(home.path)}, tmp_path / "a" / "p.log")
        assert was_forked and len(home.pids()) == 1
    env.pop(HOME_ENV, None)
    fresh, fresh_code, fresh_forked = probe(tmp_path, env, tmp_path / "b" / "p.log")
    assert not fresh_forked
    forked["env"].pop(HOME_ENV)
    assert fresh_code == forked_code == 7
    assert fresh["env"]["PHANTORA_TOKEN"] == "t0k3n" and fresh["launcher"] == os.getpid()
    assert fresh["argv"] == [str(tmp_path / "warm_probe.py"), "--setup", "x", "--transport", "ipc"]
    assert forked == fresh


def results(out: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A run's cosim.json without its wall-clock and CPU figures, and its other files' bytes."""
    summary = json.loads((out / "cosim.json").read_text())
    for k in ("wall_s", "sim_wall_s", "coordinator_busy_s"):
        summary.pop(k)
    summary["engine_stats"] = {
        k: v for k, v in summary["engine_stats"].items() if not k.endswith(("_s", "cpu", "wall"))
    }
    files = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    return summary, files


@pytest.mark.parametrize("in_coordinator", [True, False])
def test_forked_servers_give_the_results_of_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_coordinator: bool
) -> None:
    """A replay with the flow engine in the coordinator, or in a network server: forked under the session's home
    (tests/conftest.py) and fresh without it, cosim.json and flows.csv (links.csv) are the same bytes."""
    wl = ROOT / "workloads" / "moe_alltoall.toml"
    got = {}
    for kind in ("forked", "fresh"):
        if kind == "fresh":
            monkeypatch.delenv(HOME_ENV)
        run = CosimRun(
            star(4), rank_cmd=[*REPLAY, str(wl)], engine_in_coordinator=in_coordinator, out_dir=tmp_path / kind,
            timeout_s=180,
        )  # fmt: skip
        run.run()
        servers = [c for c in run.children if c.role in ("coordinator", "server")]
        assert len(servers) == (1 if in_coordinator else 2)
        assert all(isinstance(c.proc, ForkedProc) == (kind == "forked") for c in servers)
        logs = ["coordinator.log", *([] if in_coordinator else ["server.log"])]
        logs += [f"rank{r}.log" for r in range(run.spec.live_ranks)]
        assert sorted(p.name for p in (tmp_path / kind / "logs").iterdir()) == sorted(logs)  # no other log
        got[kind] = results(tmp_path / kind)
    assert got["forked"][0]["collectives"] and got["forked"][1]["flows.csv"].count(b"\n") > 10
    assert got["forked"] == got["fresh"]


@pytest.mark.parametrize(("role", "label"), [("coordinator", "the coordinator"), ("server", "the network server")])
def test_killing_a_forked_server_ends_the_run_naming_it(tmp_path: Path, role: str, label: str) -> None:
    """kill -9 of the forked coordinator (or network server) mid-run: the run ends within 5 s naming it, and no
    process is left, its fork server included."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    run = CosimRun(star(4), engine_in_coordinator=False, rank_cmd=[sys.executable, str(script), "slow"], timeout_s=120)
    killed: dict[str, Any] = {}

    def killer() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            coord = next((c for c in run.children if c.role == "coordinator"), None)
            if coord is not None and "live ranks joined" in coord.log_tail(lines=1000):  # ("" before it opened it)
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the ranks are into their collectives by now
        victim = next(c for c in run.children if c.role == role)
        killed["forked"] = isinstance(victim.proc, ForkedProc)
        killed["forkers"] = [f.child.pid for f in run._server_forkers]
        killed["t"] = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)

    th = threading.Thread(target=killer)
    th.start()
    with pytest.raises(BridgeError) as err:
        run.run()
    ended = time.monotonic()
    th.join()
    assert killed["forked"] and len(killed["forkers"]) == 2
    assert ended - killed["t"] < 5.0
    assert f"{label} (pid" in str(err.value) and "SIGKILL" in str(err.value) and "mid-run" in str(err.value)
    time.sleep(0.5)  # a fork server leaves once the launcher closed its connection
    assert alive_pids([c.pid for c in run.children] + killed["forkers"]) == []
