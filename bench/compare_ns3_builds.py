"""Do two builds of the ns-3 models give the same results? Runs a fixed set of packet-level cases with each build

Collectives are decomposed under the ideal model (`AlgoOptions(model="ideal")`: line rate, no NCCL protocol or
latency), so the engine figures stay comparable across versions; bench_nccl_tests.py measures the NCCL model.
and compares every output byte for byte.

Each build runs in its own process (`PHANTORA_NS3_LIB` picks its libphantora-ns3.so) and writes, per case, a
canonical JSON of everything the engine reports: completions, fct.txt and pfc.txt records, PFC events, queue
samples, drops, trims, CNPs, CE marks, per-flow transport stats, channel usage and the counters. The cases: every
HPCC reference run (`reference-runs/`, all four CCs, queues sampled every µs) and phantora runs on a 2:1
oversubscribed leaf-spine with NVSwitch hosts (a ring all-reduce DAG plus an incast) under DCQCN, HPCC, TIMELY,
DCTCP and Swift, spraying, the SACK receiver, three traffic classes under WRR, DLCP trimming, `wire=roce4k`,
a lossy fabric (PFC off), the HPCC models' ECMP hash, credit-based flow control and `transport=uet`; and the
same fabric's flows rate-capped on connections and queues (`capped/*`) under pauses, windows, losses and a link's
rate change. Exit status 1 if any case differs. `--old-set` / `--new-set` add PacketConfig overrides to one side's
every case; by default the old side runs ns3::MapScheduler (builds before the wheel scheduler do not have it), so
the comparison also checks the event order of the two schedulers.

    .venv/bin/python bench/compare_ns3_builds.py --old /work/wt13p-oldbuild --new ns3-scratch/build
    .venv/bin/python bench/compare_ns3_builds.py --dump OUT.json      # this process's library only
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow
from phantora.netsim.hpcc_io import read_hpcc_flows
from phantora.netsim.packet import Ns3Simulator, load_ns3
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.paths import shared_dir
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.topology.readers import read_hpcc

REF = shared_dir() / "reference-runs"
REF_CASES: list[tuple[str, str, int | None]] = [
    ("star8", "two_to_one", None),
    ("star8", "incast4", None),
    ("star8", "late_join", None),
]
REF_CASES += [("twoleaf8", "cross4", None), ("star8", "incast4", 2**20)]
# Phantora cases: name -> (--set overrides, incast priorities, loss-tolerant incast)
PHANTORA_CASES: dict[str, tuple[list[str], tuple[int, ...], bool]] = {
    "dcqcn": (["cc=dcqcn"], (3,), False),
    "hpcc": (["cc=hpcc"], (3,), False),
    "timely": (["cc=timely"], (3,), False),
    "dctcp": (["cc=dctcp"], (3,), False),
    "swift": (["cc=swift"], (3,), False),
    "dcqcn-spray": (["cc=dcqcn", "lb=spray"], (3,), False),
    "dcqcn-flowlet": (["cc=dcqcn", "lb=flowlet", "flowlet_gap_ns=2000"], (3,), False),
    "none-spray-sack": (["lb=spray", "rx=sack"], (3,), False),
    "dcqcn-classes-wrr": (["cc=dcqcn", "sched=wrr", "sched_weights=1,1,4,1,2,1,1"], (1, 3, 5), False),
    "none-classes-strict": (["sched=strict"], (1, 3, 5), False),
    "dcqcn-dlcp": (["cc=dcqcn", "trim_bytes=65536"], (3,), True),
    "dcqcn-roce4k": (["cc=dcqcn", "wire=roce4k"], (3,), False),
    "hpcc-roce4k": (["cc=hpcc", "wire=roce4k"], (3,), False),
    "dcqcn-pfc": (["cc=dcqcn", "buffer_bytes=1000000"], (3,), False),
    "dcqcn-lossy-sack": (["cc=dcqcn", "pfc=false", "buffer_bytes=1000000", "rx=sack", "rto_ns=100000"], (3,), False),
    "hpcc-ecmp-hpcc": (["cc=hpcc", "ecmp_hash=hpcc"], (3,), False),
    "dctcp-roce4k": (["cc=dctcp", "wire=roce4k"], (3,), False),
    "dcqcn-cbfc": (["cc=dcqcn", "cbfc=true", "buffer_bytes=1000000"], (3,), False),
    "uet": (["transport=uet"], (3,), False),
}
# Rate-capped cases (`capped_flows`: NCCL-like caps, connections and queues): name -> (--set overrides, incast
# priorities, a fault of rank 0's NIC link mid-run: `run_capped`). Added 2026-12-05 with the NIC's timed queue pairs
# (docs/packet-model.md, "Per-packet cost, sixth round"): pacing and caps under pauses, windows, losses and a rate
# change.
CAPPED_CASES: dict[str, tuple[list[str], tuple[int, ...], str]] = {
    "dcqcn": (["cc=dcqcn"], (3,), ""),
    "hpcc": (["cc=hpcc"], (3,), ""),
    "strict": (["cc=dcqcn", "sched=strict"], (1, 3, 5), ""),
    "pfc": (["cc=dcqcn", "buffer_bytes=1000000"], (3,), ""),
    "lossy-gbn": (["cc=dcqcn", "pfc=false", "buffer_bytes=1000000", "rto_ns=100000"], (3,), ""),
    "lossy-sack": (["cc=dcqcn", "pfc=false", "buffer_bytes=1000000", "rx=sack", "rto_ns=100000"], (3,), ""),
    "uet": (["transport=uet"], (3,), ""),
    "degrade": (["cc=dcqcn"], (3,), "link_degrade"),
    "reroute": (["cc=dcqcn", "rto_ns=100000"], (3,), "link_down"),
}


def canonical(obj: Any) -> Any:
    """Dataclasses, tuples and dicts as plain JSON values, keys sorted by json.dumps."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    return obj


def outputs(sim: Ns3Simulator, done: list[Any]) -> dict[str, Any]:
    """Everything the engine reports after a run (the wall-clock-free part)."""
    stats = {k: v for k, v in sim.stats().items() if "wall" not in k}
    return canonical(
        {
            "completions": sorted(done, key=lambda c: (c.end_ns, c.flow_id)),
            "fct": sim.fct_records(),
            "pfc": sim.pfc_events(),
            "queues": list(sim.queue_samples()),
            "drops": sim.drops(),
            "trims": sim.trims(),
            "cnps": sim.cnp_events(),
            "ecn": sim.ecn_mark_events(),
            "transport": sorted(sim.flow_transport().items()),
            "channels": sim.channel_usage(),
            "stats": stats,
        }
    )


def run_reference(topo_name: str, flows_name: str, buffer: int | None, cc: str, extra: list[str]) -> dict[str, Any]:
    topo = read_hpcc(REF / "inputs" / f"{topo_name}.topo.txt")
    flows = read_hpcc_flows(REF / "inputs" / f"{flows_name}.flows.txt", topo)
    cfg = apply_overrides(PacketConfig(cc=cc, buffer_bytes=buffer, queue_sample_ns=1000), extra)
    done = []
    with Ns3Simulator(topo, cfg) as sim:
        for start, group in groupby(flows, key=lambda f: f.start_ns):
            sim.submit([f.to_flow() for f in group], start)
        done = sim.drain()
        sim.finish()
        return outputs(sim, done)


def fabric() -> Topology:
    """16 GPUs in 4-GPU NVSwitch hosts, 2 leaves of 8 at 100 Gb/s, 2 spines, 2:1 oversubscribed."""
    return leaf_spine(2, 8, 2, nic_rate="100Gbps", oversubscription=2, gpus_per_host=4, latency="1us")


def phantora_flows(topo: Topology, prios: tuple[int, ...], loss_tolerant: bool) -> list[Flow]:
    """A 16-rank ring all-reduce of 4 MiB (its DAG) and, from t = 0, 6 ranks of leaf 1 sending 1 MB to rank 0."""
    coll = Collective("all_reduce", tuple(range(topo.num_ranks)), 4 << 20)
    ring = decompose(coll, topo, AlgoOptions("ring", "chunked", 2, model="ideal")).flows
    ranks = topo.endpoints
    base = max(f.id for f in ring) + 1
    incast = [
        Flow(
            base + i,
            ranks[8 + i],
            ranks[0],
            1_000_000,
            priority=prios[i % len(prios)],
            loss_budget=50_000 if loss_tolerant else 0,
        )
        for i in range(6)
    ]
    return [replace(f, priority=prios[f.id % len(prios)]) for f in ring] + incast


def capped_flows(topo: Topology, prios: tuple[int, ...]) -> list[Flow]:
    """`phantora_flows` as NCCL's channels send: each ring flow capped at 30 Gbit/s on the connection of its
    (source, destination); each incast sender's 1 MB as 4 messages of 250 kB capped at 40 Gbit/s, alternating
    between two connections of one queue (one at a time, in order)."""
    flows = phantora_flows(topo, prios, False)
    ring, incast = flows[:-6], flows[-6:]
    out = [replace(f, rate_bps=30 * 10**9, conn=1 + f.src * 1024 + f.dst) for f in ring]
    first = max(f.id for f in flows) + 1
    for i, f in enumerate(incast):
        for k in range(4):
            conn = 1 << 20 | 2 * i + k % 2
            out.append(Flow(first + 4 * i + k, f.src, f.dst, 250_000, tag=f"incast{i}/{k}", priority=f.priority,
                            rate_bps=40 * 10**9, conn=conn, queue=1 + i))  # fmt: skip
    return out


def run_capped(sets: list[str], prios: tuple[int, ...], fault: str, extra: list[str]) -> dict[str, Any]:
    """`capped_flows` on `fabric()`; rank 0's NIC link from 20 to 60 µs: with `fault` link_degrade at 40 Gbit/s,
    with link_down down (routing re-converges 5 µs after each change: its queue pairs stall, then move back)."""
    from phantora.netsim.packet_faults import FaultyNs3Simulator
    from phantora.netsim.scenario import LinkEvent, Scenario

    topo = fabric()
    cfg = apply_overrides(PacketConfig(queue_sample_ns=2000), sets + extra)
    flows = capped_flows(topo, prios)
    if fault:
        gpu = topo.endpoints[0]
        leaf = next(n for n, _ in topo.neighbours(gpu) if topo.nodes[n].kind == "switch")
        rate = 40 * 10**9 if fault == "link_degrade" else None
        ev = LinkEvent(kind=fault, at_ns=20_000, duration_ns=40_000, link=(gpu, leaf), rate_bps=rate)
        sim: Ns3Simulator = FaultyNs3Simulator(topo, Scenario(fault, (ev,), reconvergence_ns=5_000), cfg)
    else:
        sim = Ns3Simulator(topo, cfg)
    with sim:
        sim.submit(flows, at=0)
        done = sim.drain()
        sim.finish()
        return outputs(sim, done)


def run_phantora(sets: list[str], prios: tuple[int, ...], loss_tolerant: bool, extra: list[str]) -> dict[str, Any]:
    topo = fabric()
    cfg = apply_overrides(PacketConfig(queue_sample_ns=2000), sets + extra)
    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(phantora_flows(topo, prios, loss_tolerant), at=0)
        done = sim.drain()
        sim.finish()
        return outputs(sim, done)


def cases(extra: list[str]) -> dict[str, Callable[[], dict[str, Any]]]:
    out: dict[str, Callable[[], dict[str, Any]]] = {}
    if REF.exists():
        for topo, flows, buf in REF_CASES:
            for cc in ("none", "dcqcn", "hpcc", "dctcp"):
                name = "-".join(x for x in (topo, flows, "buf1" if buf else "", cc) if x)
                out[f"ref/{name}"] = partial(run_reference, topo, flows, buf, cc, extra)
    for name, (sets, prios, lt) in PHANTORA_CASES.items():
        out[f"phantora/{name}"] = partial(run_phantora, sets, prios, lt, extra)
    for name, (sets, prios, fault) in CAPPED_CASES.items():
        out[f"capped/{name}"] = partial(run_capped, sets, prios, fault, extra)
    return out


def dump(path: Path, only: str, extra: list[str]) -> None:
    """Run every case with this process's library; write {case: {"out": canonical outputs, "cpu_s": ...}}."""
    result = {}
    load_ns3()  # not timed: the first case would pay for it
    for name, fn in cases(extra).items():
        if only not in name:
            continue
        c0 = time.process_time()
        out = fn()
        result[name] = {"out": out, "cpu_s": time.process_time() - c0}
    path.write_text(json.dumps(result, sort_keys=True))


def first_difference(a: Any, b: Any, where: str = "") -> str:
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}/{k}: only in {'new' if k in b else 'old'}"
            if a[k] != b[k]:
                return first_difference(a[k], b[k], f"{where}/{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where}: {str(a)[:120]} vs {str(b)[:120]}"


def run_build(lib_dir: Path, out: Path, only: str, extra: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PHANTORA_NS3_LIB": str(lib_dir.resolve() / "libphantora-ns3.so")}
    cmd = [sys.executable, __file__, "--dump", str(out), "--only", only, *(f"--set={s}" for s in extra)]
    subprocess.run(cmd, env=env, check=True)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="build directory holding the old libphantora-ns3.so")
    ap.add_argument("--new", type=Path, help="build directory holding the new libphantora-ns3.so")
    ap.add_argument("--dump", type=Path, help="only run the cases with this process's library and write them here")
    ap.add_argument("--only", default="", help="the cases whose name contains this text")
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)  # --dump: overrides
    ap.add_argument("--old-set", action="append", metavar="FIELD=VALUE", help="override on the old side's runs")
    ap.add_argument("--new-set", action="append", default=[], metavar="FIELD=VALUE", help="override on the new side")
    args = ap.parse_args()
    if args.dump:
        dump(args.dump, args.only, args.set)
        return 0
    if not (args.old and args.new):
        ap.error("give --old and --new (or --dump)")
    with tempfile.TemporaryDirectory() as tmp:
        old_set = ["scheduler=ns3::MapScheduler"] if args.old_set is None else args.old_set
        print(f"old: {args.old} {' '.join(old_set)}\nnew: {args.new} {' '.join(args.new_set)}")
        old = run_build(args.old, Path(tmp) / "old.json", args.only, old_set)
        new = run_build(args.new, Path(tmp) / "new.json", args.only, args.new_set)
    differ = 0
    print(f"{'case':<40}{'events':>12}{'CE marks':>10}{'PFC':>7}{'old CPU s':>11}{'new CPU s':>11}  result")
    for name in old:
        a, b = old[name]["out"], new[name]["out"]
        same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        digest = hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()[:12]
        st = a["stats"]
        verdict = f"identical ({digest})" if same else "DIFFERENT: " + first_difference(a, b)
        differ += not same
        print(
            f"{name:<40}{st['events']:>12}{st['ecn_marks']:>10}{st['pfc_pause'] + st['pfc_resume']:>7}"
            f"{old[name]['cpu_s']:>11.2f}{new[name]['cpu_s']:>11.2f}  {verdict}"
        )
    cpu_old = sum(v["cpu_s"] for v in old.values())
    cpu_new = sum(v["cpu_s"] for v in new.values())
    print(f"\n{len(old) - differ} of {len(old)} cases identical; CPU s old {cpu_old:.1f}, new {cpu_new:.1f}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
