"""Programs that start their own ranks (torch.multiprocessing.spawn, as pytorch/examples' multigpu.py does) under
`phantora run --spawn`: the program runs once, as the launching process of one host, and each process it starts is a
rank (phantora/runtime/spawned.py). The live runs start a fresh interpreter per rank (tens of seconds on the shared
machine): slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.supervisor import alive_pids
from phantora.errors import InputError
from phantora.launcher import RunConfig, plan_processes, resolve_topology
from phantora.runtime import spawned

PROGRAM = Path(__file__).resolve().parent / "scripts" / "spawn_all_reduce.py"
NVLINK_BPS = 3600e9  # testbed16: a GPU's link to its host's NVSwitch
NVLINK_HOP_NS = 25


def test_spawn_runs_on_one_host_whose_gpus_are_the_ranks() -> None:
    """Without --nproc the program sees one host's GPUs (testbed16: 8 a host); a world beyond a host is refused."""
    topo = resolve_topology("testbed16")
    assert plan_processes(RunConfig("x.py", spawn=True), topo) == (False, 8, 8)
    assert plan_processes(RunConfig("x.py", spawn=True, nproc=3), topo) == (False, 3, 3)
    with pytest.raises(InputError, match="hosts have 8 GPUs: --nproc must be 1 to 8, got 16"):
        plan_processes(RunConfig("x.py", spawn=True, nproc=16), topo)
    with pytest.raises(InputError, match="no --dedup"):
        plan_processes(RunConfig("x.py", spawn=True, nproc=8, tensors="phantom", dedup=2), topo)


def test_a_rank_process_becomes_its_rank_before_the_program_is_imported() -> None:
    """The `-c` program of a spawned process: mp.spawn's become their ranks (in the order torch starts them) before
    the program's main module is imported; any other process waits to become one at its init_process_group."""
    prog = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"
    cmdline = spawned._preloading_command_line(lambda **kw: [sys.executable, "-c", prog, "--multiprocessing-fork"])
    spawned._pending[:] = [(0, 2), (1, 2)]
    try:
        first, second, other = cmdline(), cmdline(), cmdline()
    finally:
        spawned._pending.clear()
        spawned._started.clear()
    head, seed = "import phantora.runtime.spawned_rank as _rank;", "_rank.program_seed.seed_process"
    assert first[2] == f"{head} _rank.become_rank(0, 2); {seed}('rank 0'); {prog}"
    assert second[2] == f"{head} _rank.become_rank(1, 2); {seed}('rank 1'); {prog}"
    assert other[2] == f"{head} _rank.await_rank({os.getpid()}); {seed}('process 2'); {prog}"
    assert other[3] == "--multiprocessing-fork"


@pytest.mark.parametrize(
    ("source", "world"),
    [
        ("import torch.multiprocessing as mp\nWORLD = 2\nmp.spawn(main, args=(WORLD,), nprocs=WORLD)", 2),
        ("from torch.multiprocessing import spawn as go\ngo(main, (), 3)", 3),
        ("import torch\ntorch.multiprocessing.spawn(main)", 1),  # torch's default nprocs
        ("import torch.multiprocessing as mp\nmp.start_processes(main, nprocs=5, start_method='fork')", 5),
        ("import torch, torch.multiprocessing as mp\nmp.spawn(main, nprocs=torch.cuda.device_count())", 8),
        ("import torch.multiprocessing as mp\nn = 2\nn += 1\nmp.spawn(main, nprocs=n)", 8),  # not one binding
        ("import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)\nmp.spawn(main, nprocs=4)", 8),
        ("import pexpect\npexpect.spawn('ls')", 8),  # not torch's spawn
    ],
)
def test_without_nproc_the_world_is_the_programs_own_spawn_count(tmp_path: Path, source: str, world: int) -> None:
    """The count the program's mp.spawn / start_processes names in its source (a literal, or a name bound once to
    one; torch's default 1) is the run's world; a count read only by running it (device_count(), two counts, a
    rebound name) leaves one host's GPUs, 8 on testbed16. --nproc, when given, is the world."""
    script = tmp_path / "prog.py"
    script.write_text(source + "\n")
    topo = resolve_topology("testbed16")
    assert plan_processes(RunConfig(str(script), spawn=True), topo) == (False, world, world)
    assert plan_processes(RunConfig(str(script), spawn=True, nproc=6), topo) == (False, 6, 6)


def test_a_spawn_count_beyond_the_host_names_the_call(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import torch.multiprocessing as mp\n\nmp.spawn(main, nprocs=16)\n")
    with pytest.raises(InputError, match=r"the program's mp.spawn\(nprocs=16\) at prog.py:3 must be 1 to 8, got 16"):
        plan_processes(RunConfig(str(script), spawn=True), resolve_topology("testbed16"))


DIES_WITH = """
import os, sys, time
from phantora.runtime import death_signal
launcher = os.getpid()
if os.fork():
    if sys.argv[1] == "dead":
        os._exit(0)  # the launching process dies before its rank sets its death signal
    time.sleep(1.5)  # alive while its rank sets it
    os._exit(0)
if sys.argv[1] == "dead":
    while os.getppid() == launcher:
        time.sleep(0.01)
death_signal.die_with_parent(launcher)
print("rank carries on", flush=True)
"""


@pytest.mark.parametrize("launcher", ["dead", "alive"])
def test_a_rank_whose_launcher_died_before_its_death_signal_dies(launcher: str) -> None:
    """prctl(PR_SET_PDEATHSIG) sends nothing for a parent already dead (prctl(2)): a rank whose launching process
    died first is reparented, sees it by getppid() and dies by SIGKILL at once; under a live launcher it carries on.
    (The rank shares the test's stdout pipe, so the run returns when it ended.)"""
    proc = subprocess.run([sys.executable, "-c", DIES_WITH, launcher], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == ("" if launcher == "dead" else "rank carries on\n")


def test_a_start_the_run_cannot_follow_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(spawned.SpawnError, match=r"`f` starts 2 ranks on a host of 4 GPUs \(--nproc 4\): run it with"):
        spawned._check_start("`f`", 2, "spawn")
    with pytest.raises(spawned.SpawnError, match="start_method='forkserver'"):
        spawned._check_start("`f`", 4, "forkserver")
    spawned._check_start("`f`", 4, "fork")


def phantora_run(out: Path, *args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--spawn", "--nproc", "4"]
    cmd += [*options, "--out", str(out), "--no-progress", str(PROGRAM), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out.parent)


def rank_log(out: Path, rank: int) -> str:
    return (out / "logs" / f"rank{rank}.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("process",)])
def test_spawned_ranks_all_reduce_in_the_ring_closed_form(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """4 spawned ranks (mp.spawn, or plain spawn-method Processes that name their rank to init_process_group)
    all-reduce 16 MiB of fp32 on one host: each is cuda:rank of the 4 GPUs the parent saw, the sum is 1+2+3+4, and
    under the ideal collective model (line rate) the all-reduce takes the ring's 2(n-1)/n x S / B over NVLink, plus
    at most a hop pair's latency a step."""
    out = tmp_path / "out"
    proc = phantora_run(out, str(4 * 2**20), *extra, options=("--collective-model", "ideal"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sees 4 GPUs, available True" in (out / "logs" / "spawner.log").read_text()
    assert "parent: every rank finished" in (out / "logs" / "spawner.log").read_text()
    for r in range(4):
        assert f"rank {r} on cuda:{r} of 4: sum 10" in rank_log(out, r)
    results = json.loads((out / "results.json").read_text())
    assert results["run"]["world_size"] == 4 and results["run"]["live_processes"] == 4
    (ar,) = json.loads((out / "cosim.json").read_text())["collectives"]
    n, size = 4, 4 * 2**20 * 4
    assert ar["kind"] == "all_reduce" and ar["nbytes"] == size and sorted(ar["group"]) == [0, 1, 2, 3]
    ring_ns = 2 * (n - 1) / n * size * 8 / NVLINK_BPS * 1e9
    took = ar["end_ns"] - ar["t_start"]
    assert ring_ns <= took <= ring_ns + 2 * (n - 1) * 2 * NVLINK_HOP_NS, (took, ring_ns)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("process",)])
def test_a_spawned_rank_that_fails_ends_the_run_naming_it(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """Rank 2 raises while the others wait in the all-reduce: the run exits non-zero within seconds, its last line
    names rank 2 and its error, and no process of the run is left. With mp.spawn, torch's join stops the others and
    the line names the call; with plain Processes, which nothing joins that way, the failing rank stops the
    launching process's group."""
    out = tmp_path / "out"
    proc = phantora_run(out, "1024", "fail=2", *extra)
    ended = time.time()
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    line = PROGRAM.read_text().splitlines().index('        raise ValueError(f"rank {rank} gives up")') + 1
    assert last.endswith(f"rank 2 failed (at {PROGRAM}:{line} in main): ValueError: rank 2 gives up")
    if not extra:
        call = '`mp.spawn(main, args=args, nprocs=int(words.get("nprocs", world)))`'
        assert f"SpawnError: rank 2, started by {call}" in last
    assert ended - os.path.getmtime(out / "logs" / "rank2.log") < 15  # the run ended within seconds of the failure
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    pids = [int(line.split(" pid ")[1].split()[0]) for line in logs.splitlines() if " pid " in line]
    assert len(pids) == 5 and alive_pids(pids) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("no-spawn", "phantora: the program started no ranks: with --spawn, phantora runs the script once"),
        ("nprocs=2", "starts 2 ranks on a host of 4 GPUs (--nproc 4): run it with --nproc 2"),
    ],
)
def test_a_wrong_launch_fails_in_one_line(tmp_path: Path, mode: str, says: str) -> None:
    proc = phantora_run(tmp_path / "out", "1024", mode)
    assert proc.returncode != 0
    assert says in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("process",)])
def test_killing_the_launcher_leaves_no_process_of_the_program(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """SIGKILL to `phantora run --spawn` while the program's 4 ranks hold: within seconds neither the launching
    process nor any rank is left (the fork server's death signal, then the ranks' own)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--spawn", "--nproc", "4"]
    cmd += ["--out", str(out), "--no-progress", str(PROGRAM), "1024", "hold=300", *extra]
    launcher = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logs = "".join(p.read_text() for p in (out / "logs").glob("*.log")) if (out / "logs").is_dir() else ""
        if logs.count(": sum 10") == 4:
            pids = [int(line.split(" pid ")[1].split()[0]) for line in logs.splitlines() if " pid " in line]
            break
        time.sleep(0.5)
    assert len(pids) == 5 and alive_pids(pids) == pids
    launcher.kill()
    launcher.wait()
    gone_by = time.monotonic() + 10
    while alive_pids(pids) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert alive_pids(pids) == []


@pytest.mark.slow
def test_a_plain_process_rank_killed_outright_ends_the_run_in_one_line(tmp_path: Path) -> None:
    """SIGKILL (as the OOM killer sends) to one of 4 plain-Process ranks while they hold: the launching process sees
    it (nothing else joins such ranks as torch's join does) and the run ends within seconds, naming the process."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--spawn", "--nproc", "4"]
    cmd += ["--out", str(out), "--no-progress", str(PROGRAM), "1024", "hold=300", "process"]
    launcher = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logs = "".join(p.read_text() for p in (out / "logs").glob("*.log")) if (out / "logs").is_dir() else ""
        if logs.count(": sum 10") == 4:
            break
        time.sleep(0.5)
    spawner = (out / "logs" / "spawner.log").read_text()
    victim = int(next(ln for ln in spawner.splitlines() if ln.startswith("rank 1 pid ")).split()[-1])
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode != 0 and time.monotonic() - killed_at < 15
    last = err.strip().splitlines()[-1]
    said = f"phantora: process {victim} (SpawnProcess-2) that the program started was killed by SIGKILL"
    assert last.startswith(said)
