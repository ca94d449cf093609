"""Which whole-DAG driver `--set workers=N` should build (issue 38 item 2, `factory.WHOLE_DAG_DRIVER`): the plain
`DecomposedSimulator` or route (a)'s `HybridDecomposedSimulator`, side by side, and one engine (``one``: workers=0)
as the base of the 1.7x goal. The plain drivers run their fluid NVLink side as the factory does by default, in the
driver (`factory.WHOLE_DAG_FLUID = "driver"`), but ``shards``: the plain driver with its fluid side in shard
processes, one a worker (`WHOLE_DAG_FLUID = "procs"`); ``inworkers``: ``planned`` with a shard served in each worker's
process (`WHOLE_DAG_FLUID = "workers"`, the default on 2026-12-05 from 20:39 to 21:11); ``infold``: ``planned`` with
the fluid side in the driver, whatever the default (`WHOLE_DAG_FLUID = "driver"`); ``held``: the plain driver
without outer gates (`factory.OUTER_GATES = False`: the hybrid holds a packet flow behind the fluid side until it is
released); ``planned``: the plain driver whose workers plan the workload's independent groups of ops as they start
(`replay.PLAN_ON_WORKERS = True`, the engine made inside `plan_split.jobs_ahead` as `replay.settle_groups` makes it;
the others plan in the driver, while the workers start: `PLAN_ON_WORKERS = False`). Prints figures only.

Cases (each run is a fresh process, nvlink=fluid, wire=roce4k, nic_latency=1us, DCQCN, rail128, workers=2):

- ``replay:SIZE``: `replay_inprocess` of workloads/rail_allreduce.toml at SIZE (two hierarchical all-reduces), each
  collective chunked (`AlgoOptions(granularity="chunked")`, 90,112 flows at 64 MiB).
- ``moe:SIZE``: the same of workloads/moe_rail_alltoall.toml at SIZE per GPU (per rail a dispatch all-to-all, 1 ms
  of expert compute, a combine; `bench_decompose.py --pattern a2a-rail`'s traffic with the workload's gap).
- ``job:DIR``: a user's job, `phantora replay DIR` of a recording (`phantora run --record DIR ...`) on rail128 with
  the settings above and ``reuse=on``, run in this process as the `phantora` program runs it (its GC policy); its key
  is of the files a user reads (flows.csv, links.csv and results.json's simulated figures), and its driver CPU the
  whole command's (loading, planning, writing the files), against the same of one engine.
- ``nccl``: the live `phantora nccl-tests all_reduce_perf -b 1M -e 4M -f 2 -n 2 -w 1` (c7472cb's command), which
  submits as it goes; its hybrid run is the factory made to build the hybrid there too (whole_dag forced).

Each run prints the driver process's CPU inside the simulation, its workers' CPU (reaped children), the rounds, the
run's wall, the critical path on 2 free cores (CPU s: the driver's own work between rounds plus, per round, the larger
of its busiest worker's CPU and the driver's meanwhile; one engine: its CPU), and a key of its results (sha256 of the
sorted (id, start, end) for a replay, of the table's rows for nccl-tests; 12 hex digits), which must be equal between
drivers. Runs alternate as --order says (default plain, hybrid, hybrid, plain: the load drifts); a run past
--timeout is stopped (its process group) and printed unfinished.
Then per case, the best of each driver, hybrid / plain ratios, and one engine's best CPU over each driver's best
critical path (the 1.7x goal).

    cd CLONE && PYTHONPATH=CLONE nice -n 10 .venv/bin/python bench/bench_whole_dag_driver.py \\
        --cases replay:8MiB replay:64MiB nccl --timeout 600
    ... --cases replay:64MiB moe:16MiB --order one plain hybrid hybrid plain one
    ... --cases job:G replay:1GiB --order one planned planned one --timeout 1500   (G: a recorded job)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

SETTINGS = ["--set", "nvlink=fluid", "--set", "wire=roce4k", "--set", "nic_latency=1us", "--set", "workers=2"]
NCCL = ["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "4M", "-f", "2", "-n", "2", "-w", "1"]
NCCL += ["--topology", "rail128", "--network", "ns3", "--cc", "dcqcn", *SETTINGS]


def force_driver(driver: str, everywhere: bool) -> None:
    """Make the factory build `driver` for whole-DAG callers, and with `everywhere` for every caller (``shards``:
    plain with its fluid side in shard processes, `factory.WHOLE_DAG_FLUID`)."""
    from phantora.netsim import factory

    if driver == "shards":
        factory.WHOLE_DAG_FLUID = "procs"
        driver = "plain"
    if driver in ("infold", "inworkers"):  # planned, the fluid side in the driver's process or the workers'
        factory.WHOLE_DAG_FLUID = "driver" if driver == "infold" else "workers"
        driver = "planned"
    if driver == "held":  # plain, the packet flows behind the fluid side held by the hybrid (no outer gates)
        factory.OUTER_GATES = False
        driver = "plain"
    from phantora import replay

    replay.PLAN_ON_WORKERS = driver == "planned"  # (the others plan in the driver)
    if driver == "planned":  # plain, the workload's groups of ops planned on its workers as they start
        driver = "plain"
    factory.WHOLE_DAG_DRIVER = driver
    if everywhere:
        made = factory.make_engine

        def make_engine(*args: Any, **kw: Any) -> Any:
            return made(*args, **{**kw, "whole_dag": True})

        factory.make_engine = make_engine  # type: ignore[assignment]


def rounds_of(stats: Any) -> int | None:
    """The decomposition's rounds in an engine's stats (nested anywhere under a "decompose" key)."""
    if isinstance(stats, dict):
        d = stats.get("decompose")
        if isinstance(d, dict) and "rounds" in d:
            return int(d["rounds"])
        for v in stats.values():
            r = rounds_of(v)
            if r is not None:
                return r
    return None


DRIVERS = ("plain", "hybrid", "shards", "held", "planned", "infold", "inworkers")
WORKLOADS = {"replay": ("rail_allreduce.toml", 'bytes = "8MiB"'), "moe": ("moe_rail_alltoall.toml", 'bytes = "16MiB"')}


def critical_of(stats: Any, driver_cpu: float) -> float | None:
    """The critical path on free cores, CPU s: the driver's CPU less what it did while its workers ran, plus per round
    max(busiest worker, the driver meanwhile) (the decomposition's stats), plus the fluid shard processes' critical
    CPU outside the rounds (``shards``: inside them it is in the driver's meanwhile), plus the busiest worker's CPU
    planning groups of ops (`plan_cpu_s`: the driver waits for it); None without decomposition stats."""
    d = stats.get("decompose") if isinstance(stats, dict) else None
    if not isinstance(d, dict) or "overlap_cpu_s" not in d:
        return None
    meanwhile = float(d.get("meanwhile_cpu_s", 0.0)) + float(d.get("built_cpu_s", 0.0))
    helpers = float(d.get("helper_cpu_s", 0.0)) - float(d.get("helper_meanwhile_cpu_s", 0.0))
    return driver_cpu - meanwhile + float(d["overlap_cpu_s"]) + helpers + float(d.get("plan_cpu_s", 0.0))


def run_replay(case: str, size: str, workers: int) -> dict[str, Any]:
    """One chunked replay of the case's workload at `size` on the factory's whole-DAG driver (one engine at 0)."""
    from bridge.workers import spawn_workers
    from phantora import replay
    from phantora.collectives.spec import AlgoOptions
    from phantora.netsim import factory
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.packet_config import PacketConfig
    from phantora.plan_split import jobs_ahead, split_jobs
    from phantora.replay import replay_inprocess
    from phantora.topology.loader import load_topology
    from phantora.workload import load_workload

    name, line = WORKLOADS[case]
    src = (ROOT / "workloads" / name).read_text()
    if line not in src:
        raise SystemExit(f"workloads/{name}: no `{line}` line to set the size on")
    topo = load_topology("rail128")
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    with tempfile.TemporaryDirectory() as tmp:
        wl_path = Path(tmp) / "rail.toml"
        wl_path.write_text(src.replace(line, f'bytes = "{size}"'))
        wl = load_workload(wl_path, world=topo.num_ranks)
    spec = EngineSpec("ns3", replace(config, workers=workers))
    opts = AlgoOptions(granularity="chunked").on_engine(spec)
    split = split_jobs(wl, opts) if replay.PLAN_ON_WORKERS else None  # (as `replay.settle_groups`: its CPU is noise)
    with jobs_ahead(split[1] if split is not None else None):  # (`planned`: the workers plan the groups as they start)
        sim = factory.make_engine(spec, topo, spawner=spawn_workers, whole_dag=True)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        res = replay_inprocess(wl, topo, sim, opts)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        stats = sim.stats()
    finally:
        sim.close()
    comps = sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions)
    key = hashlib.sha256(repr(comps).encode()).hexdigest()[:12]
    crit = critical_of(stats, cpu) if workers else cpu
    out = {"cls": type(sim).__name__, "driver_cpu": cpu, "wall": wall, "rounds": rounds_of(stats), "key": key}
    d = stats.get("decompose") if isinstance(stats, dict) else None
    if isinstance(stats, dict) and stats.get("outer_gated"):
        out["outer_gated"] = stats["outer_gated"]  # (packet flows handed over behind an outer gate)
    if isinstance(d, dict) and d.get("helper_cpu_s"):
        out["shards_cpu"] = d["helper_cpu_s"]  # (``shards``: their critical CPU, in `crit`)
    if isinstance(d, dict) and "overlap_cpu_s" in d:
        # the critical path's parts: the driver between rounds, the rounds, of them the busiest workers alone
        alone = cpu - float(d["meanwhile_cpu_s"]) - float(d.get("built_cpu_s", 0.0))
        out["split"] = [round(alone, 3), round(float(d["overlap_cpu_s"]), 3), round(float(d["critical_cpu_s"]), 3)]
    if isinstance(d, dict) and d.get("plan_wall_s"):  # the workers planned: the busiest one's CPU, the driver's wait
        out["plan"] = [round(float(d["plan_cpu_s"]), 3), round(float(d["plan_wall_s"]), 3)]
    return {**out, "crit": crit, "flows": len(comps)}


JOB_SETTINGS = [*SETTINGS[:-2], "--set", "reuse=on"]  # (workers set per run)


def job_key(out: Path) -> str:
    """sha256 (12 hex digits) of a replay's tables (flows.csv, links.csv, pfc.csv, ...: every one it wrote, byte for
    byte) and results.json's figures of the simulation (all but `engine_stats`, the engine's own counters, and `run`,
    the command's settings)."""
    from phantora.results.reproduce import TABLES

    h = hashlib.sha256()
    for name in TABLES:
        if (out / name).is_file():
            h.update(name.encode() + b"\0" + (out / name).read_bytes())
    res = json.loads((out / "results.json").read_text())
    h.update(json.dumps({k: v for k, v in res.items() if k not in ("engine_stats", "run")}, sort_keys=True).encode())
    return h.hexdigest()[:12]


def run_job(graph: str, workers: int) -> dict[str, Any]:
    """`phantora replay GRAPH` (a recorded job) in this process under the run's GC policy, `workers=N` (0: one
    engine); its CPU and wall from the command line's parse to its files written."""
    from phantora.cli import main
    from phantora.netsim.gc_pause import use_run_policy

    if not (Path(graph) / "graph.json").is_file():
        raise SystemExit(f"--cases job:{graph}: no graph.json there (record one with `phantora run --record DIR`)")
    use_run_policy()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        argv = ["replay", graph, "--topology", "rail128", "--network", "ns3", "--cc", "dcqcn", *JOB_SETTINGS]
        argv += ["--set", f"workers={workers}"] if workers else []
        c0, t0 = time.process_time(), time.perf_counter()
        rc = main([*argv, "--queue-sample-ns", "0", "--out", str(out)])
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"phantora replay {graph} exited {rc}")
        key = job_key(out)
        stats = json.loads((out / "results.json").read_text()).get("engine_stats", {})
    crit = critical_of(stats, cpu) if workers else cpu
    out_ = {"cls": "-", "driver_cpu": cpu, "wall": wall, "rounds": rounds_of(stats), "key": key, "crit": crit}
    d = stats.get("decompose") if isinstance(stats, dict) else None
    if isinstance(d, dict) and "overlap_cpu_s" in d:
        alone = cpu - float(d["meanwhile_cpu_s"]) - float(d.get("built_cpu_s", 0.0))
        out_["split"] = [round(alone, 3), round(float(d["overlap_cpu_s"]), 3), round(float(d["critical_cpu_s"]), 3)]
    if isinstance(d, dict) and d.get("plan_wall_s"):
        out_["plan"] = [round(float(d["plan_cpu_s"]), 3), round(float(d["plan_wall_s"]), 3)]
    return out_


def run_nccl() -> dict[str, Any]:
    """The live nccl-tests command, in this process, on the factory as forced."""
    from phantora.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        c0, t0 = time.process_time(), time.perf_counter()
        rc = main([*NCCL, "--out", str(out)])
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"nccl-tests exited {rc}")
        rows = [ln for ln in (out / "nccl-tests.txt").read_text().splitlines() if ln.strip()[:1].isdigit()]
        stats = json.loads((out / "results.json").read_text())
    key = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:12]
    return {"cls": "-", "driver_cpu": cpu, "wall": wall, "rounds": rounds_of(stats), "key": key, "crit": None}


def one(case: str, driver: str) -> None:
    """Run `case` on `driver` in this process and print one JSON line (after the command's own output)."""
    force_driver("plain" if driver == "one" else driver, everywhere=case == "nccl")
    if case == "nccl":
        out = run_nccl()
    elif case.startswith("job:"):
        out = run_job(case[len("job:") :], 0 if driver == "one" else 2)
    else:
        kind, size = case.split(":", 1)
        out = run_replay(kind, size, 0 if driver == "one" else 2)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["workers_cpu"] = kids.ru_utime + kids.ru_stime
    print("RESULT " + json.dumps(out), flush=True)


def spawn(case: str, driver: str, timeout: float) -> dict[str, Any] | None:
    """One run in a fresh process group; None if it did not finish within `timeout` s (the group is stopped)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", case, driver]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own run and its workers, by their group
        proc.communicate()
        return None
    if proc.returncode != 0:
        raise SystemExit(f"{case} {driver}: exited {proc.returncode}")
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return dict(json.loads(line[len("RESULT ") :]))


def show(case: str, driver: str, r: dict[str, Any] | None, timeout: float) -> None:
    if r is None:
        print(f"{case:14} {driver:6}  unfinished at {timeout:.0f} s wall (stopped)", flush=True)
        return
    crit = "-" if r.get("crit") is None else f"{r['crit']:7.2f} s"
    print(
        f"{case:14} {driver:6}  wall {r['wall']:7.2f} s  driver CPU {r['driver_cpu']:7.2f} s  "
        f"workers CPU {r['workers_cpu']:7.2f} s  critical {crit}  rounds {r['rounds']}  key {r['key']}  "
        + (f"shards critical {r['shards_cpu']:.2f} s  " if r.get("shards_cpu") else "")
        + (f"planned by workers {r['plan'][0]:.2f} s CPU, waited {r['plan'][1]:.2f} s  " if r.get("plan") else "")
        + ("alone / rounds / busiest {:.2f} / {:.2f} / {:.2f} s  ".format(*r["split"]) if r.get("split") else "")
        + f"({r['cls']}, {r.get('flows', '-')} flows)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["replay:8MiB", "replay:64MiB", "nccl"])
    ap.add_argument(
        "--order",
        nargs="+",
        default=["plain", "hybrid", "hybrid", "plain"],
        choices=["one", *DRIVERS],
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="wall seconds a run may take (default 600)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "DRIVER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(*a.one)
        return
    for case in a.cases:
        if case != "nccl" and case.split(":", 1)[0] not in (*WORKLOADS, "job"):
            raise SystemExit(f"--cases: {case!r} is neither nccl, replay:SIZE, moe:SIZE nor job:DIR")
        if case == "nccl" and "one" in a.order:
            raise SystemExit("--order: one engine is measured on the replay cases only, not nccl")
    print(f"load {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    summary = []
    for case in a.cases:
        runs: dict[str, list[dict[str, Any] | None]] = {d: [] for d in ("one", *DRIVERS)}
        for driver in a.order:
            r = spawn(case, driver, a.timeout)
            show(case, driver, r, a.timeout)
            runs[driver].append(r)
        summary.append((case, runs))
    print(f"load {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    print("best of each driver, hybrid / plain:")
    for case, runs in summary:
        done = {d: [r for r in rs if r is not None] for d, rs in runs.items()}
        keys = {r["key"] for rs in done.values() for r in rs}
        same = "yes" if len(keys) == 1 else "NO " + str(sorted(keys))
        if done["plain"] and done["hybrid"]:
            cols = []
            for name in ("wall", "driver_cpu", "workers_cpu", "rounds"):
                p = min(r[name] for r in done["plain"])
                h = min(r[name] for r in done["hybrid"])
                cols.append(f"{name} {p:.2f} / {h:.2f} = {h / p:.2f}x" if p else f"{name} {p} / {h}")
            print(f"{case:14} " + ", ".join(cols) + f"; keys equal {same}")
        else:
            unrun = [d for d in ("plain", "hybrid") if not done[d]]
            print(f"{case:14} no finished run of {' or '.join(unrun)}; keys equal {same}")
        if done["one"]:
            one_cpu = min(r["driver_cpu"] for r in done["one"])
            for d in DRIVERS:
                crits = [r["crit"] for r in done[d] if r.get("crit")]
                if crits:
                    print(
                        f"{'':14} one engine CPU {one_cpu:.2f} / {d} critical {min(crits):.2f} = "
                        f"{one_cpu / min(crits):.2f}x (goal 1.7x)"
                    )


if __name__ == "__main__":
    main()
