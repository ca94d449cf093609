"""Parallel packet simulation across cut cables (issue 38): one keyed engine vs partition workers. Prints figures.

The traffic is an MoE all-to-all: every endpoint of a leaf-spine sends `--bytes` to every other at once, without
dependencies. Each variant runs it to the end in the keyed mode: one engine in this process, then `partition=N`
worker processes for each N of `--workers` (N=1: one worker process, no cable cut). Printed side by side from one
run: wall, the CPU of the run (ns-3 and the windows' messaging, per worker), start-up CPU (ns-3 import and the
fabric), windows and barrier exchanges, message bytes, peak memory, whether every completion, FCT record, PFC
frame and channel counter row (each link's bytes, packets, pause, marks and peak queue: not empty in a prefix no
flow has finished) equals the one engine's, and whether the completions, FCT records and PFC frames come in its
order too, with the records of one ns from two workers that the merge put in order by their events' keys
(`phantora.netsim.record_order`).

Then "on paper" for P = 8, 16 and 64 cores, one worker a core: T(P) = C / P x imbalance + X x e(P) + M(P) x m,
with C the one engine's CPU, the imbalance the largest run's busiest worker's ns-3 CPU over the mean, X the
barrier exchanges (set by the traffic and the lookahead, not by P: every worker takes part in every barrier),
e(P) the CPU of an empty exchange with P - 1 peers (measured here with 2 and the largest N processes exchanging
nothing, linear in the peers; `--exchange`: by default the C++ window loop's exchange, which workers on one machine
run, `bench/bench_cut_exchange.py`), M(P) a worker's message bytes (an all-to-all on a leaf-spine cuts 1 - 1/P of
its traffic, split over P workers) and m the message handling CPU a byte (the largest run's messaging CPU
outside ns-3's windows less its empty exchanges, over its bytes). A projection, not a measurement.

    .venv/bin/python bench/bench_partition.py --workers 1 2
    .venv/bin/python bench/bench_partition.py --leaves 8 --per-leaf 8 --spines 4 --bytes 64KiB --workers 1 2 4

With `--batches FILE` (`bench/capture_packet_side.py`: what one keyed engine's ns-3 was given of a recorded graph's
prefix under nvlink=fluid) the traffic is those batches instead, each submitted at its own ns with its
dependencies, on the capture's topology and settings, run to the capture's limit; "live" then also says whether
every completion equals the one the captured run's ns-3 returned.

    .venv/bin/python bench/bench_partition.py --batches /tmp/cap.msgpack --workers 1 2 4 8

With `--results DIR` nothing is run: the on-paper table comes from a finished `phantora replay --set partition=N`
run's results.json (its workers' ns-3 and run CPU, windows and message bytes; C is then the workers' ns-3 CPU
summed, the work one engine would run), with `--serial-s S` (the driver's CPU that no worker overlaps: its whole
CPU less `meanwhile_cpu_s`) added to every row, and the model's figure at N beside the run's own critical path
(S + `critical_cpu_s`: per round the busiest worker's CPU, summed).

    .venv/bin/python bench/bench_partition.py --results D --serial-s 120
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

import msgpack

from bridge.columns import completions_from_columns, flows_from_columns
from bridge.cut_pool import run_partitioned_batches
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.generators import leaf_spine
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes

UNTIL_NS = 10_000_000_000  # 10 s: far past the end of any traffic here
Batches = list[tuple[int, list[Flow]]]
RECORDS = ("completions", "fct", "pfc")  # compared in order too (channels: as a set)


def all_to_all(topo: Topology, size: int) -> list[Flow]:
    """Every endpoint to every other, `size` bytes each, all at once."""
    eps = topo.endpoints
    return [Flow(i * len(eps) + j, s, d, size) for i, s in enumerate(eps) for j, d in enumerate(eps) if s != d]


def captured(path: str) -> tuple[Topology, PacketConfig, Batches, int, list[tuple[int, int, int]]]:
    """A `bench/capture_packet_side.py` file: its topology, settings, batches, limit and live completions."""
    cap = msgpack.unpackb(Path(path).read_bytes(), raw=False, strict_map_key=False)
    batches = [(int(at), flows_from_columns(cols)) for at, cols in cap["batches"]]
    live = sorted((c.flow_id, c.start_ns, c.end_ns) for c in completions_from_columns(cap["done"]))
    return load_topology(cap["topology"]), apply_overrides(PacketConfig(), cap["sets"]), batches, cap["until"], live


def one_engine(
    topo: Topology, cfg: PacketConfig, batches: Batches, until: int = UNTIL_NS
) -> tuple[dict[str, Any], dict[str, float]]:
    w0, c0 = time.perf_counter(), time.process_time()
    with Ns3Simulator(topo, cfg) as sim:
        setup = time.process_time() - c0
        for at, flows in batches:
            sim.submit(flows, at)
        r0, rc0 = time.perf_counter(), time.process_time()
        done = sim.advance(until)
        run_cpu, run_wall = time.process_time() - rc0, time.perf_counter() - r0
        events = float(str(sim.stats().get("events", 0)))
        rec = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in done),
            "fct": sim.fct_records(),  # in the engine's order (time, then its keyed event order)
            "pfc": sim.pfc_events(),
            "channels": sim.channel_rows(),  # every link's bytes, packets, pause, marks, peak queue
        }
    fig = {"wall": time.perf_counter() - w0, "run_wall": run_wall, "run_cpu": run_cpu, "setup_cpu": setup}
    fig["events"] = events
    return rec, fig


def _sorted(records: list[Any]) -> list[Any]:
    return sorted(records, key=lambda r: r if isinstance(r, tuple) else dataclasses.astuple(r))


def exchange_cost(n: int, kind: str = "native", k: int = 2000) -> float:
    """CPU of one empty barrier exchange (no message) per worker, mean over `n` processes exchanging `k` times over
    `kind` (`bench_cut_exchange.KINDS`: ``native``, the C++ window loop's exchange that local workers run)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_cut_exchange import exchange

    return exchange(kind, n, 0, k)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--per-leaf", type=int, default=8)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--bytes", default="64KiB", help="bytes each endpoint sends each other endpoint")
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", help="a bench/capture_packet_side.py file to run instead of the all-to-all")
    ap.add_argument("--results", help="a finished `phantora replay --set partition=N` output folder: project only")
    ap.add_argument("--serial-s", type=float, default=0.0, help="with --results: the driver's serial CPU s")
    ap.add_argument("--exchange", default="native", choices=("native", "unix", "zmq"),
                    help="the exchange the model's e(P) measures: native (the C++ window loop's, what workers on "
                         "one machine run), unix (the Python loop's), zmq (ZeroMQ: tcp, CurveZMQ, Ray)")  # fmt: skip
    args = ap.parse_args()
    if args.results:
        from_results(args.results, args.serial_s, args.exchange)
        return
    live: list[tuple[int, int, int]] | None = None
    if args.batches:
        topo, cfg, batches, until, live = captured(args.batches)
        print(f"# {args.batches}: {sum(len(b) for _, b in batches):,} flows in {len(batches):,} batches on "
              f"{topo.name}, to {until:,} ns, cc {cfg.cc}, nvlink {cfg.nvlink}, keyed mode")  # fmt: skip
    else:
        topo, until = leaf_spine(args.leaves, args.per_leaf, args.spines, nvswitch=False), UNTIL_NS
        batches = [(0, all_to_all(topo, parse_size_bytes(args.bytes)))]
        cfg = apply_overrides(PacketConfig(cc=args.cc), [f"scheduler={KEYED_SCHEDULER}"])
        print(f"# all-to-all on leaf_spine({args.leaves}, {args.per_leaf}, {args.spines}): {len(batches[0][1])} "
              f"flows of {args.bytes}, cc {args.cc}, keyed mode")  # fmt: skip
    want, one = one_engine(topo, cfg, batches, until)
    if live is not None:
        print(f"# one engine's completions equal the captured run's (live): {want['completions'] == live}")
    print(f"# one engine: {one['events']:,.0f} events, {one['events'] / one['run_cpu'] / 1e6:.2f} M events / CPU s")
    head = "| variant | wall s | run wall s | run CPU s (per worker) | ns-3 CPU s | start-up CPU s | windows | "
    print(head + "exchanges | message MB | peak RSS MB | equal | order |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| one engine | {one['wall']:.2f} | {one['run_wall']:.2f} | {one['run_cpu']:.2f} | {one['run_cpu']:.2f} | "
          f"{one['setup_cpu']:.2f} | - | - | - | - | - | - |")  # fmt: skip
    last: list[dict[str, Any]] = []
    for n in args.workers:
        res = run_partitioned_batches(topo, cfg.with_updates(partition=n), batches, until)
        got: dict[str, list[Any]] = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions),
            "fct": res.fct,
            "pfc": res.pfc,
            "channels": [tuple(row) for row in res.channels],
        }
        equal = all(_sorted(got[k]) == _sorted(want[k]) for k in want)
        order = ("same" if all(got[k] == want[k] for k in RECORDS) else "NOT") + f" ({res.ties} ties by key)"
        ws = res.workers
        per = " / ".join(f"{w['run_cpu_s']:.2f}" for w in ws)
        ns3 = " / ".join(f"{w['ns3_cpu_s']:.2f}" for w in ws)
        setup = " / ".join(f"{w['setup_cpu_s']:.2f}" for w in ws)
        run_wall = max(w["run_wall_s"] for w in ws)
        mb = sum(w["bytes_out"] for w in ws) / 1e6
        rss = max(w["maxrss_kb"] for w in ws) / 1024
        print(f"| partition={n} | {res.wall_s:.2f} | {run_wall:.2f} | {per} | {ns3} | {setup} | {ws[0]['windows']} | "
              f"{ws[0]['exchanges']} | {mb:.1f} | {rss:.0f} | {'yes' if equal else 'NO'} | {order} |")  # fmt: skip
        print(f"#   partition={n} windows ended by {ws[0]['ended_by']}, widths in ns {ws[0]['widths']}")
        last = ws
    if len(last) >= 2:
        project(one["run_cpu"], last, exchange=args.exchange)


def from_results(folder: str, serial: float, exchange: str = "native") -> None:
    """The on-paper table from a partition run's results.json (module docstring, `--results`)."""
    import json

    part = json.loads((Path(folder) / "results.json").read_text())["engine_stats"]["partition"]
    n = int(part["workers"])
    ws = [
        {"ns3_cpu_s": ns3, "run_cpu_s": run, "exchanges": part["windows"], "bytes_out": part["message_bytes"] / n}
        for ns3, run in zip(part["ns3_cpu_s"], part["run_cpu_s"], strict=True)
    ]
    c = sum(w["ns3_cpu_s"] for w in ws)
    run = " / ".join(f"{w:.1f}" for w in part["run_cpu_s"])
    ns3 = " / ".join(f"{w:.1f}" for w in part["ns3_cpu_s"])
    crit = part["critical_cpu_s"]
    print(f"# {folder}: partition={n}, {part['rounds']:,} rounds, {part['windows']:,} windows, run CPU s a worker "
          f"{run} (ns-3 {ns3}); critical path measured {serial + crit:.1f} s = serial {serial:.1f} + busiest per "
          f"round {crit:.1f} ({crit / max(part['run_cpu_s']):.2f}x "
          f"the busiest worker's whole run: the rounds' own imbalance, which the model leaves out)")  # fmt: skip
    project(c, ws, serial, also=(n,), c_is="the workers' ns-3 CPU summed", exchange=exchange)


def project(
    c: float,
    ws: list[dict[str, Any]],
    serial: float = 0.0,
    also: tuple[int, ...] = (),
    c_is: str = "one engine",
    exchange: str = "native",
) -> None:
    """The on-paper table (module docstring) from the largest partition measured; `serial` CPU s added to every
    row (and to C in the speed-up), `also` more core counts (the measured one, to set the model beside it), e(P)
    measured over `exchange` (`exchange_cost`)."""
    n = len(ws)
    cpu = [w["ns3_cpu_s"] for w in ws]
    imbalance = max(cpu) / (sum(cpu) / n)
    x = ws[0]["exchanges"]
    bytes_w = sum(w["bytes_out"] for w in ws) / n  # a worker's message bytes (sent ~ received)
    handling = max(w["run_cpu_s"] - w["ns3_cpu_s"] for w in ws)  # its messaging CPU outside ns-3's windows
    fixed = {p: exchange_cost(p, exchange) for p in sorted({2, n})}  # an empty exchange's CPU, 1 and n - 1 peers
    per_peer = (fixed[n] - fixed[2]) / (n - 2) if n > 2 else fixed[2]
    base = fixed[2] - per_peer
    per_byte = max(handling - x * fixed[n], 0.0) / bytes_w
    print(
        f"\n# on paper (one worker a core), from partition={n}: C = {c:.2f} s ({c_is}), "
        f"imbalance {imbalance:.2f}, X = {x} exchanges; an empty {exchange} exchange {fixed[2] * 1e6:.1f} us CPU "
        f"with 1 peer, {fixed[n] * 1e6:.1f} us with {n - 1}; message handling {per_byte * 1e9:.1f} ns CPU a byte "
        f"({bytes_w / 1e6:.1f} MB a worker)"
    )
    print("| cores | serial s | ns-3 share s | exchanges s | messages s | projected s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for p in sorted({*also, 8, 16, 64}):
        share = c / p * imbalance
        ex = x * (base + per_peer * (p - 1))
        # cut bytes of an all-to-all on a leaf-spine: (1 - 1/p) of the whole, split over p workers
        msg = bytes_w * n / (1 - 1 / n) * (1 - 1 / p) / p * per_byte
        total = serial + share + ex + msg
        row = f"| {p} | {serial:.2f} | {share:.2f} | {ex:.2f} | {msg:.2f} | {total:.2f}"
        print(f"{row} | {(c + serial) / total:.1f}x |")


if __name__ == "__main__":
    main()
