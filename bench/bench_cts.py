"""NCCL's clear-to-send as a flow (docs/collectives.md, "The clear-to-send on the wire"): what it costs and does.

    bench_cts.py cost KIND BYTES [ALGO] [TOPOLOGY]
                                   one chunked call on testbed16 (or TOPOLOGY) through ns-3 (DCQCN): its flows, its
                                   CTSs, the engine's CPU s and wall s for submit and drain (KIND all_reduce:
                                   ALGO/Simple over every GPU, ALGO Ring unless given, e.g. Tree; all_to_all: every
                                   GPU, NCCL's choice, no ALGO; send_recv: GPU 0 -> 8, no ALGO)
    bench_cts.py pxn               a 4 MiB send relayed by PXN (rank 1 -> 2 of 2 x 2 H100, rank 0 relays) with NICs of
                                   25 and 400 Gbit/s, on the flow engine and ns-3 (DCQCN): when the sender's last
                                   NVLink step ends (its kernel's end) and when the transfer does
    bench_cts.py window            a window-bound p2p connection (64 x 16 KiB, 2 in flight, 0 -> 1 on a star of
                                   100 Gbit/s, 1 µs links) alone and with 3 x 4 MiB of reverse traffic into its sender,
                                   on the flow engine and ns-3 (DCQCN): its end and its CTSs' longest FCT
    bench_cts.py tree              a 2-GPU tree all-reduce (64 x 64 KiB up and down, GPU 1 the leaf) on the same star,
                                   links of 1 and 50 µs, 1 step in flight an edge (the tree before 2026-12-05) and 8
                                   (NCCL_STEPS), alone and with 3 x 4 MiB into the leaf, flow engine and ns-3 (DCQCN):
                                   its end, its CTSs and their longest FCT
    bench_cts.py tree-seeds N [K]  the tree's case of 1 µs links, 8 in flight, 3 x 4 MiB into the leaf on ns-3 (DCQCN)
                                   under seeds 1..N (the switches' random ECN draw): its end, the CE marks, the
                                   reverse flows' last end, and the ends' mean, median, stdev; K: marking as a step at
                                   K bytes (kmin = kmax = K at 100 Gbit/s, pmax 1: no draw)
    bench_cts.py tree-calls        one Tree all-reduce on testbed16 alone, each protocol, 1-256 MiB x 4, on the flow
                                   engine: its end coarse (NCCL's time) and chunked, and the chunked call's flows,
                                   its decompose CPU s and the flow engine's (one run each, after a warm-up call)
    bench_cts.py relayed DIR...    a run's flows.csv: per call, from its first flow's start, its end and the end of
                                   the senders' last NVLink (PXN) step, median and latest
    bench_cts.py relay-steps DIR...
                                   a run's flows.csv: each PXN NVLink step and the relay's network step that sends it
                                   on (the nearest by flow id from the relay with its tag less "/pxn" and its bytes):
                                   how long after the NVLink step's end the network step starts, and how many before
    bench_cts.py flows DIR...      a run's flows.csv (`--out DIR`): the CTSs' FCT by (receiver, sender), and the
                                   median FCT of the steps of ops named `in*` (an incast's)
    bench_cts.py acks              a chunked ring all-reduce of 48 MiB over 3 GPUs of the star, 512 KiB chunks, 2 in
                                   flight, links of 1 and 50 µs, flow engine and ns-3 (DCQCN): its end, its flows and
                                   the ACKs its kernels' staging slots wait for (`Credits.acked`)
    bench_cts.py posted DIR...     a run's flows.csv: each call's CTS queues (receiver, sender, tag), when CTS k of
                                   the first 8 leaves after the queue's first (the receiving proxy's turns)
    bench_cts.py moe [NIC_NS]      the MoE replay of `bench_whole_dag_driver.py --cases moe:16MiB --order one` (its
                                   workload, rail128, DCQCN, fluid NVLink; `nic_latency` NIC_NS, default 1000): its
                                   flows and CTSs, one engine's CPU s, each op's end, and the FCT of dispatch0's
                                   first CTSs (those released first)

Run it in two clones side by side (`PYTHONPATH=CLONE .venv/bin/python bench/bench_cts.py ...`) for a before/after.
"""

from __future__ import annotations

import csv
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.topology import Topology, load_topology

KiB, MiB, G = 1 << 10, 1 << 20, 10**9


def _cpu_s() -> float:
    """This process's and its children's CPU seconds."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _is_cts(tag: str, src: object, dst: object) -> bool:
    return tag.endswith("/credit") and src != dst


def cost(kind: str, nbytes: int, *more: str) -> None:
    algo = more[0] if kind == "all_reduce" and more else "Ring"
    more = more[1:] if kind == "all_reduce" else more
    topo = load_topology(more[0] if more else "testbed16")
    env = nccl_env({"NCCL_ALGO": algo, "NCCL_PROTO": "Simple"} if kind == "all_reduce" else {})
    ranks = (0, 8) if kind == "send_recv" else tuple(range(topo.num_ranks))
    dag = decompose(Collective(kind, ranks, nbytes, "fp32"), topo, AlgoOptions(granularity="chunked", nccl_env=env))
    cts = sum(_is_cts(f.tag, f.src, f.dst) for f in dag.flows)
    spec = EngineSpec(network="ns3", packet=PacketConfig(cc="dcqcn"))
    for warm in (True, False):  # the first run loads ns-3
        cpu, wall = _cpu_s(), time.perf_counter()
        sim = make_engine(spec, topo)
        sim.submit(dag.flows, at=0)
        end = max(c.end_ns for c in sim.drain())
        sim.close()
        if not warm:
            name = f"{kind} {algo}" if kind == "all_reduce" else kind
            print(f"{name} {nbytes}: flows {len(dag.flows)} cts {cts} end_ns {end} "
                  f"cpu_s {_cpu_s() - cpu:.3f} wall_s {time.perf_counter() - wall:.3f}")  # fmt: skip


def _star(n: int, latency_ns: int = 1000) -> tuple[Topology, list[int]]:
    t = Topology()
    gpus = [t.add_node("gpu", host=i) for i in range(n)]
    sw = t.add_node("switch")
    for g in gpus:
        t.add_link(g, sw, 100 * G, latency_ns)
    return t.validate(), gpus


def _run(network: str, topo: Topology, flows: list[Flow]) -> dict[int, Completion]:
    """Each flow's completion, `flows` submitted at 0 on `network` ("flow", or ns-3 with DCQCN)."""
    sim = make_engine(EngineSpec(network=network, packet=PacketConfig(cc="dcqcn")), topo)
    try:
        sim.submit(flows, at=0)
        return {c.flow_id: c for c in sim.drain()}
    finally:
        sim.close()


def _star_builder(latency_ns: int, name: str) -> tuple[Topology, list[int], DagBuilder]:
    """A star of 5 GPUs one a host and a chunked builder over them with NCCL's credits (communicator `name`)."""
    from phantora.collectives.back_pressure import credit_latency

    topo, gpus = _star(5, latency_ns)
    b = DagBuilder(gpus, tuple(range(5)), 0, "", comm=communicator_id(name, range(5)))
    b.host_of = {g: i for i, g in enumerate(gpus)}
    b.credit_ns = credit_latency(topo, gpus)
    return topo, gpus, b


def _reverse(flows: list[Flow], gpus: list[int], into: int) -> list[Flow]:
    """`flows` and 3 x 4 MiB from GPUs 2-4 into GPU `into` (reverse traffic on the receiver's NIC)."""
    first = max(f.id for f in flows) + 1
    return flows + [Flow(first + i, gpus[2 + i], gpus[into], 4 * MiB, tag=f"reverse{i}") for i in range(3)]


def window() -> None:
    for network in ("flow", "ns3"):
        for reverse in (False, True):
            topo, gpus, b = _star_builder(1000, "p2p")
            fwd = b.add_chunks(0, 1, [16 * KiB] * 64, "p2p", 0, window=2)
            flows = b.finish().flows
            flows = _reverse(flows, gpus, 0) if reverse else flows
            done = _run(network, topo, flows)
            cts = [done[f.id].end_ns - done[f.id].start_ns for f in flows if _is_cts(f.tag, f.src, f.dst)]
            print(f"{network:4} reverse={'3x4MiB' if reverse else 'none  '} end_ns {done[fwd[-1]].end_ns} "
                  f"cts {len(cts)} longest_cts_fct_ns {max(cts)}")  # fmt: skip


def tree() -> None:
    from phantora.collectives.tree import tree_flows

    for latency in (1000, 50_000):
        for window in (1, 8):
            for network in ("flow", "ns3"):
                for reverse in (False, True):
                    topo, gpus, b = _star_builder(latency, "tree")
                    tree_flows(b, [None, 0, None, None, None], 64 * 64 * KiB, 0, up=True, down=True, chunked=True,
                               chunk_bytes=64 * KiB, step_delay_ns=0, name="tree", window=window)  # fmt: skip
                    flows = b.finish().flows
                    flows = _reverse(flows, gpus, 1) if reverse else flows
                    done = _run(network, topo, flows)
                    end = max(done[f.id].end_ns for f in flows if not f.tag.startswith("reverse"))
                    cts = [done[f.id].end_ns - done[f.id].start_ns for f in flows if _is_cts(f.tag, f.src, f.dst)]
                    print(f"link {latency:6} ns window {window} {network:4} "
                          f"reverse={'3x4MiB' if reverse else 'none  '} end_ns {end} cts {len(cts)} "
                          f"longest_cts_fct_ns {max(cts, default=0)}")  # fmt: skip


def tree_seeds(n: int, step_bytes: int | None) -> None:
    from phantora.collectives.tree import tree_flows

    marks: dict[str, Any] = {}
    if step_bytes is not None:
        marks = {"kmin_map": {100 * G: step_bytes}, "kmax_map": {100 * G: step_bytes}}
    ends = []
    for seed in range(1, n + 1):
        topo, gpus, b = _star_builder(1000, "tree")
        tree_flows(b, [None, 0, None, None, None], 64 * 64 * KiB, 0, up=True, down=True, chunked=True,
                   chunk_bytes=64 * KiB, step_delay_ns=0, name="tree", window=8)  # fmt: skip
        flows = _reverse(b.finish().flows, gpus, 1)
        config = PacketConfig(cc="dcqcn", seed=seed, pmax_map={100 * G: 1.0} if marks else None, **marks)
        sim = make_engine(EngineSpec(network="ns3", packet=config), topo)
        try:
            sim.submit(flows, at=0)
            done = {c.flow_id: c.end_ns for c in sim.drain()}
            stats = sim.stats()
        finally:
            sim.close()
        ends.append(max(done[f.id] for f in flows if not f.tag.startswith("reverse")))
        reverse = max(done[f.id] for f in flows if f.tag.startswith("reverse"))
        print(f"seed {seed:3} end_ns {ends[-1]} ecn_marks {stats['ecn_marks']} reverse_end_ns {reverse}", flush=True)
    if n > 1:
        us = [e / 1e3 for e in ends]
        print(f"seeds 1-{n}: end mean {statistics.mean(us):.1f} us, median {statistics.median(us):.1f}, "
              f"stdev {statistics.stdev(us):.1f}, min {min(us):.1f}, max {max(us):.1f}")  # fmt: skip


def tree_calls() -> None:
    from phantora.netsim.flow import FlowSimulator

    topo = load_topology("testbed16")
    decompose(Collective("all_reduce", tuple(range(16)), MiB, "fp32"), topo, AlgoOptions(granularity="chunked"))
    for proto in ("LL", "LL128", "Simple"):
        env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": proto})
        for size in (MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB):
            ends, count, cpu = [], 0, [0.0, 0.0]
            for granularity in ("coarse", "chunked"):
                coll = Collective("all_reduce", tuple(range(16)), size, "fp32")
                start = time.process_time()
                dag = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=env))
                planned = time.process_time()
                sim = FlowSimulator(topo)
                sim.submit(dag.flows, at=0)
                ends.append(max(c.end_ns for c in sim.drain()) / 1e3)
                count, cpu = len(dag.flows), [planned - start, time.process_time() - planned]
            print(f"Tree {proto:6} {size // MiB:4} MiB: coarse {ends[0]:.2f} us chunked {ends[1]:.2f} us "
                  f"({ends[1] / ends[0] - 1:+.2%}), chunked flows {count}, decompose {cpu[0]:.2f} "
                  f"flow engine {cpu[1]:.2f} CPU s")  # fmt: skip


def pxn() -> None:
    from phantora.collectives.back_pressure import is_credit
    from phantora.topology import rail_optimized

    for gbps in (25, 400):
        topo = rail_optimized(2, 2, spines=2, nic_rate=gbps * G, gpu="h100")
        coll = Collective("send_recv", (1, 2), 4 * MiB, "fp32", None, (0, 1, 2, 3))
        dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({})))
        s, v = topo.node_of_rank(1), topo.node_of_rank(0)
        nvlink = [f.id for f in dag.flows if (f.src, f.dst) == (s, v) and not is_credit(f)]
        for network in ("flow", "ns3"):
            done = {i: c.end_ns for i, c in _run(network, topo, dag.flows).items()}
            print(f"nic {gbps:3} Gbit/s {network:4}: sender's last NVLink step ends {done[nvlink[-1]]} ns, "
                  f"the transfer {max(done.values())} ns")  # fmt: skip


def relayed(dirs: list[str]) -> None:
    for d in dirs:
        calls: dict[str, tuple[int, int, dict[str, int]]] = {}  # call -> (first start, end, sender -> last NVLink end)
        for r in csv.DictReader((Path(d) / "flows.csv").open()):
            call = "/".join(r["tag"].split("/")[:3])
            start, end, senders = calls.get(call, (1 << 62, 0, {}))
            calls[call] = (min(start, int(r["start_ns"])), max(end, int(r["end_ns"])), senders)
            if "/pxn/" in r["tag"]:
                senders[r["src"]] = max(senders.get(r["src"], 0), int(r["end_ns"]))
        print(d)
        for call, (start, end, senders) in calls.items():
            last = [(t - start) / 1e3 for t in senders.values()] or [0.0]
            print(f"  {call}: ends {(end - start) / 1e3:.2f} us, senders' last NVLink step median "
                  f"{statistics.median(last):.2f} max {max(last):.2f} us ({len(senders)} senders)")  # fmt: skip


def relay_steps(dirs: list[str]) -> None:
    for d in dirs:
        rows = {int(r["flow_id"]): r for r in csv.DictReader((Path(d) / "flows.csv").open())}
        ids = sorted(rows)
        taken: set[int] = set()
        gaps = []
        for k, n in enumerate(ids):
            r = rows[n]
            if "/pxn" not in r["tag"]:
                continue
            want = (r["dst"], r["tag"].replace("/pxn", ""), r["size_bytes"])
            near = (ids[k + o] for o in sorted(range(-300, 301), key=abs) if o and 0 <= k + o < len(ids))
            m = next((m for m in near if m not in taken and _sent_on(rows[m]) == want), None)
            if m is not None:
                taken.add(m)
                gaps.append(int(rows[m]["start_ns"]) - int(r["end_ns"]))
        gaps.sort()
        print(f"{d}: {sum('/pxn' in r['tag'] for r in rows.values())} NVLink steps, {len(gaps)} paired; network start "
              f"- NVLink end min {gaps[0] if gaps else 0} ns, median {gaps[len(gaps) // 2] if gaps else 0}; "
              f"{sum(g < 0 for g in gaps)} start before it")  # fmt: skip


def _sent_on(r: dict[str, str]) -> tuple[str, str, str]:
    return r["src"], r["tag"], r["size_bytes"]


def flows(dirs: list[str]) -> None:
    for d in dirs:
        rows = list(csv.DictReader((Path(d) / "flows.csv").open()))
        by: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            if _is_cts(r["tag"], r["src"], r["dst"]):
                by.setdefault((r["src"], r["dst"]), []).append(int(r["fct_ns"]))
        steps = [int(r["fct_ns"]) for r in rows if r["tag"].startswith("in") and not r["tag"].endswith("/credit")]
        print(f"{d}: flows {len(rows)}, incast steps' FCT median {statistics.median(steps) / 1e3:.1f} us"
              if steps else f"{d}: flows {len(rows)}")  # fmt: skip
        for (src, dst), fct in sorted(by.items()):
            print(f"  CTS {src} -> {dst}: {len(fct)}, FCT median {statistics.median(fct):.1f} ns, max {max(fct)}")


def acks() -> None:
    from phantora.collectives.ring import ring_collective

    for latency in (1000, 50_000):
        topo, gpus, b = _star_builder(latency, "ring")
        ring_collective(b, "all_reduce", [[0, 1, 2]], [48 * MiB], chunked=True, chunk_bytes=512 * KiB,
                        step_delay_ns=0, window=2, in_turn=True)  # fmt: skip
        flows = b.finish().flows
        n_acks = sum(f.tag.endswith("/ack/credit") for f in flows)
        for network in ("flow", "ns3"):
            done = _run(network, topo, flows)
            print(f"link {latency:6} ns {network:4}: ring end_ns {max(c.end_ns for c in done.values())} "
                  f"flows {len(flows)} acks {n_acks}")  # fmt: skip


def posted(dirs: list[str]) -> None:
    """Each call's first CTSs on each queue (src, dst, tag): when CTS k leaves after the queue's first (median over
    the queues of every call, ns), and the call's first data step's start after its first CTS's."""
    for d in dirs:
        rows = list(csv.DictReader((Path(d) / "flows.csv").open()))
        queues: dict[tuple[str, str, str, str], list[int]] = {}
        for r in rows:
            if _is_cts(r["tag"], r["src"], r["dst"]):
                call = "/".join(r["tag"].split("/")[:3])
                queues.setdefault((call, r["src"], r["dst"], r["tag"]), []).append(int(r["start_ns"]))
        ks: dict[int, list[int]] = {}
        for starts in queues.values():
            starts.sort()
            for k, t in enumerate(starts[:8]):
                ks.setdefault(k, []).append(t - starts[0])
        print(f"{d}: {len(queues)} CTS queues")
        for k, offs in sorted(ks.items()):
            print(f"  CTS {k}: {len(offs)} queues, after the first median {statistics.median(offs):.0f} ns, "
                  f"min {min(offs)}, max {max(offs)}")  # fmt: skip


def moe(nic_ns: int) -> None:
    import tempfile
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_whole_dag_driver import ROOT, WORKLOADS

    from bridge.workers import spawn_workers
    from phantora.netsim import factory
    from phantora.replay import replay_inprocess
    from phantora.workload import load_workload

    name, line = WORKLOADS["moe"]
    topo = load_topology("rail128")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "moe.toml"
        path.write_text((ROOT / "workloads" / name).read_text())
        wl = load_workload(path, world=topo.num_ranks)
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=nic_ns)
    spec = EngineSpec("ns3", replace(config, workers=0))
    sim = factory.make_engine(spec, topo, spawner=spawn_workers, whole_dag=True)
    try:
        cpu = _cpu_s()
        res = replay_inprocess(wl, topo, sim, AlgoOptions(granularity="chunked"))
        cpu = _cpu_s() - cpu
    finally:
        sim.close()
    ends: dict[str, int] = {}
    first: dict[int, list[int]] = {}
    cts = 0
    for c in res.completions:
        op = c.tag.split("/")[0]
        ends[op] = max(ends.get(op, 0), c.end_ns)
        if _is_cts(c.tag, c.src, c.dst):
            cts += 1
            if op == "dispatch0":
                first.setdefault(c.start_ns, []).append(c.end_ns - c.start_ns)
    print(f"moe {line} nic_latency {nic_ns}: flows {len(res.completions)} cts {cts} cpu_s {cpu:.2f}")
    for op in sorted(ends):
        print(f"  {op} ends {ends[op] / 1e3:.3f} us")
    if first:
        fct = first[min(first)]
        print(f"  dispatch0's first {len(fct)} CTSs (released at {min(first)} ns): FCT min {min(fct)} median "
              f"{statistics.median(fct)} max {max(fct)} ns")  # fmt: skip


def main(argv: list[str]) -> None:
    if argv[:1] == ["cost"] and len(argv) in (3, 4, 5):
        cost(argv[1], int(argv[2]), *argv[3:])
    elif argv == ["pxn"]:
        pxn()
    elif argv[:1] == ["relayed"] and len(argv) > 1:
        relayed(argv[1:])
    elif argv == ["window"]:
        window()
    elif argv == ["tree"]:
        tree()
    elif argv[:1] == ["tree-seeds"] and len(argv) in (2, 3):
        tree_seeds(int(argv[1]), int(argv[2]) if len(argv) == 3 else None)
    elif argv == ["tree-calls"]:
        tree_calls()
    elif argv[:1] == ["relay-steps"] and len(argv) > 1:
        relay_steps(argv[1:])
    elif argv[:1] == ["flows"] and len(argv) > 1:
        flows(argv[1:])
    elif argv == ["acks"]:
        acks()
    elif argv[:1] == ["posted"] and len(argv) > 1:
        posted(argv[1:])
    elif argv[:1] == ["moe"] and len(argv) <= 2:
        moe(int(argv[1]) if len(argv) == 2 else 1000)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
