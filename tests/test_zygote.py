"""Zygotes (bridge/zygote.py): fork servers forked from one kept across runs, the same runs, the same clean-up.

The session's own home (tests/conftest.py) already serves every live run of the suite, the killed-rank and
killed-launcher tests of tests/test_forkserver.py included; these tests check what is the zygote's own: runs
share one, a run of another start-up gets another, and a zygote never outlives its owner or its use.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_runtime_e2e import star

from bridge import zygote
from bridge.run import CosimRun
from bridge.supervisor import alive_pids
from bridge.zygote import HOME_ENV, ZygoteHome
from tests.proc_waits import wait_gone

ROOT = Path(__file__).resolve().parents[1]
ONE = "import torch, torch.distributed as dist\ndist.init_process_group()\nprint(dist.get_rank(), os.getppid())\n"
WHERE = "import os, torch.distributed as dist\ndist.init_process_group()\nprint('cwd', os.getcwd())\n"
# The ranks' preload in these tests: not the session's (a zygote of their own), and the one module their ranks
# import anyway (with torch), so that each zygote imports it once instead of each rank.
PRELOAD = "phantora.runtime.bootstrap"


def preloading(home: ZygoteHome, preload: str) -> list[int]:
    """The home's zygotes whose preloads are `preload` (the ranks' here, `PRELOAD`; "bridge.coordinator": the
    coordinator's, bridge/warm_start.py)."""
    out = []
    for pid in home.pids():
        try:  # a zygote 30 s unused may leave between the listing and this read
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "--preload" in argv and argv[argv.index("--preload") + 1] == preload:
            out.append(pid)
    return out


def one_run(tmp_path: Path) -> tuple[int, set[int]]:
    """A two-rank run of `ONE` whose ranks are forked from a zygote of `PRELOAD`: its fork server's pid, and the ranks'
    parents as each rank printed them."""
    script = tmp_path / "one.py"
    script.write_text("import os\n" + ONE)
    run = CosimRun(
        star(2),
        rank_cmd=[sys.executable, "-m", "phantora.runtime.bootstrap", str(script)],
        rank_preload=(PRELOAD,),
        timeout_s=120,
        cwd=str(tmp_path),  # no module's name: the zygote of no directory
    )
    result = run.run()
    server = next(c.pid for c in run.children if c.role == "forkserver")
    parents = {int(m[1]) for r in (0, 1) for m in re.finditer(rf"^{r} (\d+)$", result.logs[f"rank {r}"], re.M)}
    return server, parents


def test_runs_of_one_start_up_share_a_zygote_and_another_start_up_gets_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ZygoteHome() as home:
        (a, a_parents), (b, b_parents) = one_run(tmp_path), one_run(tmp_path)
        first, coordinators = set(preloading(home, PRELOAD)), set(preloading(home, "bridge.coordinator"))
        assert len(first) == 1  # one zygote served both runs' ranks
        assert len(coordinators) == 1  # and one both coordinators (bridge/warm_start.py)
        assert a != b and a_parents == {a} and b_parents == {b}  # each run's ranks were forked by its own server
        monkeypatch.setenv("PHANTORA_ZYGOTE_TEST_VARIANT", "1")  # another start-up environment: another zygote
        one_run(tmp_path)
        # a zygote of its own; the first may have left meanwhile (30 s unused: a loaded machine's run takes longer)
        assert len(set(preloading(home, PRELOAD)) - first) == 1
        assert len(set(preloading(home, "bridge.coordinator")) - coordinators) == 1
        zygotes = home.pids()
    assert wait_gone(zygotes, 5.0) == []  # the home's close stops them


def test_runs_in_directories_that_hold_no_imported_module_share_the_zygote_of_no_directory(tmp_path: Path) -> None:
    """A fork server started in such a directory imports the same files as one started anywhere else: the runs share
    one zygote, started in the home; a directory holding a file named as a module the zygote imported (errno.py)
    gets a zygote of its own. Each run's ranks run in its directory."""
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    dirs = [tmp_path / d for d in ("a", "b", "c")]
    for d in dirs:
        d.mkdir()
    (dirs[2] / "errno.py").write_text("")  # built in, never imported from a file: the check is by name
    with ZygoteHome() as home:
        counts, seen = [], set()
        for d in dirs:
            run = CosimRun(
                star(2),
                rank_cmd=[sys.executable, "-m", "phantora.runtime.bootstrap", str(script)],
                rank_preload=(PRELOAD,),
                timeout_s=120,
                cwd=str(d),
            )
            result = run.run()
            assert f"cwd {d}" in result.logs["rank 0"] and f"cwd {d}" in result.logs["rank 1"]
            seen |= set(preloading(home, PRELOAD))  # the ranks' zygotes so far (one may leave after 30 s unused)
            counts.append(len(seen))
        assert counts == [1, 1, 2]


def test_the_key_is_the_start_up_and_ignores_the_per_test_and_per_run_variables() -> None:
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    base = zygote.key("/py", ("torch",), env, "/w")
    assert zygote.key("/py", ("torch",), {**env, "PYTEST_CURRENT_TEST": "t.py::x (call)"}, "/w") == base
    assert zygote.key("/py", ("torch",), {**env, "PHANTORA_RECORD_DIR": "/tmp/rec"}, "/w") == base  # a run's own
    for other in (
        zygote.key("/py2", ("torch",), env, "/w"),
        zygote.key("/py", ("torch", "json"), env, "/w"),
        zygote.key("/py", ("torch",), {**env, "OMP_NUM_THREADS": "2"}, "/w"),
        zygote.key("/py", ("torch",), env, "/elsewhere"),
    ):
        assert other != base


def test_a_home_others_can_enter_or_that_is_gone_is_not_used(tmp_path: Path) -> None:
    with ZygoteHome() as home:
        assert zygote.usable_home({HOME_ENV: str(home.path)}) == home.path
        assert oct(home.path.stat().st_mode & 0o777) == oct(0o700)
        home.path.chmod(0o755)
        assert zygote.usable_home({HOME_ENV: str(home.path)}) is None
    assert zygote.usable_home({HOME_ENV: str(home.path)}) is None  # removed
    assert zygote.usable_home({}) is None


@pytest.mark.parametrize("idle_s", [zygote.IDLE_S, math.inf])  # inf: the test session's home (tests/conftest.py)
def test_a_zygote_and_its_runs_leave_with_the_homes_owner(tmp_path: Path, idle_s: float) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with ZygoteHome(idle_s=idle_s) as home:
            (home.path / zygote.OWNER_FILE).write_text(str(owner.pid))
            server, sock = zygote.run_server(
                home.path, sys.executable, ("json",), dict(os.environ), str(tmp_path), tmp_path / "f"
            )
            (pid,) = home.pids()
            assert alive_pids([pid, server]) == [pid, server]
            owner.kill()
            owner.wait()
            assert wait_gone([pid, server], 2.0) == []
            sock.close()
    finally:
        owner.kill()


def test_an_idle_zygote_unlinks_its_socket_and_leaves(tmp_path: Path) -> None:
    with ZygoteHome() as home:
        path = home.path / "k.sock"
        cmd = [sys.executable, "-m", "bridge.zygote", "--listen", str(path), "--owner", str(os.getpid())]
        proc = subprocess.Popen([*cmd, "--preload", "json", "--idle-s", "0.5"], cwd=ROOT)
        deadline = time.monotonic() + 30
        while not (path.exists() and home.pids()) and time.monotonic() < deadline:  # the pid file follows the bind
            time.sleep(0.02)
        assert path.exists() and home.pids() == [proc.pid]
        assert proc.wait(timeout=10) == 0
        assert not path.exists() and home.pids() == []


def test_a_homes_idle_time_is_its_zygotes_counted_from_their_last_runs_end(tmp_path: Path) -> None:
    """A zygote stays while a run's fork server lives, then leaves after the home's idle time; a home of `math.inf`
    keeps it until the home closes."""
    env = dict(os.environ)
    with ZygoteHome(idle_s=0.5) as home:
        server, sock = zygote.run_server(home.path, sys.executable, ("json",), env, str(tmp_path), tmp_path / "f")
        (pid,) = home.pids()
        time.sleep(1.5)  # three idle times with the run's fork server alive
        assert alive_pids([pid, server]) == [pid, server]
        sock.close()  # the run ends: its fork server leaves, and then its zygote
        assert wait_gone([server, pid], 5.0) == []
        assert home.pids() == []
    with ZygoteHome(idle_s=math.inf) as home:
        server, sock = zygote.run_server(home.path, sys.executable, ("json",), env, str(tmp_path), tmp_path / "f")
        (pid,) = home.pids()
        sock.close()
        assert wait_gone([server], 5.0) == []
        time.sleep(1.5)
        assert alive_pids([pid]) == [pid] and home.pids() == [pid]
    assert wait_gone([pid], 5.0) == []  # the home's close stops it


def test_a_run_whose_log_path_is_relative_is_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run started with a relative `--out` (its fork server log `out/logs/forkserver.log`, relative to the launcher's
    directory) is served, and the log lands there: the zygote's fork opened the path in the zygote's own directory
    (FileNotFoundError, the connection closed unanswered: "closed every connection before serving it")."""
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    with ZygoteHome(idle_s=math.inf) as home:
        server, sock = zygote.run_server(
            home.path, sys.executable, ("json",), dict(os.environ), str(tmp_path), Path("out") / "f.log"
        )
        assert alive_pids([server]) == [server]
        assert (tmp_path / "out" / "f.log").exists()
        sock.close()
        assert wait_gone([server], 5.0) == []


@pytest.mark.parametrize("idle_s", [0.0, -1.0, math.nan])
def test_a_home_refuses_an_idle_time_that_is_not_positive(idle_s: float) -> None:
    with pytest.raises(ValueError, match="idle_s"):
        ZygoteHome(idle_s=idle_s)
