"""The driver's results writing for served episodes' CE marks and CNPs (issue 38), at a chosen scale. Prints figures.

Profile reuse (`phantora.netsim.reuse`) repeats a recorded episode's records for every episode it serves: the
1024-GPU Llama-3-8B step wrote 5.36 M CE marks and as many CNPs, nearly all from its 94 served episodes. This bench
builds one recorded episode's tail (`--marks` records, each of the episode's `--flows` flows), serves it
`--served` times at other starts with other flow ids, and times what `write_network_files` does with them in this
tree: the merged marks and CNPs (`ProfileReuseSimulator.ecn_mark_events` / `cnp_events`: ns-3's own, none here,
and every served episode's, shifted, renamed, in time order), each flow's counts for flows.csv, and ecn_marks.csv
and cnps.csv. It runs on any tree (the records as objects before `phantora.netsim.record_columns`, as columns
after), so two trees side by side give the ratio; CPU seconds, and the files' sha-256 to show they are equal.

    PHANTORA_TREE=TREE .venv/bin/python bench/bench_results_write.py --marks 57000 --flows 2048 --served 94

With `--completions N` it also writes flows.csv for N completed flows between the fabric's endpoints (the 1024-GPU
step's 1.6 M rows: `--completions 1600000`). Where the tree formats a large file by forked processes
(`phantora.results.forked`, at most `PHANTORA_WRITE_PROCS`), each file's line gives this process's CPU and each
child's: on free cores the file takes about this process's share plus its slowest child's, not their sum.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("PHANTORA_TREE") or str(Path(__file__).resolve().parents[1]))  # the tree measured

import phantora.results.write as W
from phantora.netsim.observe import CnpEvent, EcnMark, FabricRecords, PfcEvent
from phantora.netsim.reuse import ProfileReuseSimulator
from phantora.topology.loader import load_topology

try:  # this tree keeps records as columns
    from phantora.netsim.record_columns import RecordColumns
except ImportError:  # the tree before it: lists of objects
    RecordColumns = None  # type: ignore[assignment,misc]


class Served:
    """What `ProfileReuseSimulator`'s merge reads of itself: now() and the served tails (tail, start, ids)."""

    def __init__(self, tails: list[tuple[Any, int, list[int]]]) -> None:
        self.tails = tails

    def now(self) -> int:
        return 1 << 62

    def _served_tails(self) -> list[tuple[Any, int, list[int]]]:
        return self.tails


class Tail:
    def __init__(self, records: FabricRecords) -> None:
        self.records = records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default="leafspine1024")
    ap.add_argument("--marks", type=int, default=57_000, help="CE marks (and CNPs) of the recorded episode")
    ap.add_argument("--flows", type=int, default=2048, help="flows of the episode")
    ap.add_argument("--served", type=int, default=94, help="episodes served from it")
    ap.add_argument("--completions", type=int, default=0, help="also flows.csv for this many completed flows")
    args = ap.parse_args()
    topo = load_topology(args.topology)
    eps = topo.endpoints
    switches = [i for i, n in enumerate(topo.nodes) if n.kind == "switch"]
    n, f = args.marks, args.flows
    marks = [EcnMark(i * 97 % 900_000, switches[i % len(switches)], i % 8, 3, i % 4000, i % f) for i in range(n)]
    marks.sort(key=lambda m: m.time_ns)
    cnps = [CnpEvent(m.time_ns + 500, eps[i % len(eps)], m.flow_id, eps[(i + 1) % len(eps)], i) for i, m in
            enumerate(marks)]  # fmt: skip
    no_pfc: list[PfcEvent] = []
    if RecordColumns is not None:
        rec = FabricRecords(RecordColumns.of(PfcEvent, no_pfc), [], [], RecordColumns.of(CnpEvent, cnps),
                            RecordColumns.of(EcnMark, marks))  # fmt: skip
    else:
        rec = FabricRecords([], [], [], cnps, marks)
    tails = [(Tail(rec), 1_000_000 * (k + 1), [100_000 * k + p for p in range(f)]) for k in range(args.served)]
    me = Served(tails)
    c0 = time.process_time()
    if RecordColumns is not None:
        got_marks = ProfileReuseSimulator._merged(me, EcnMark, [], "marks")  # type: ignore[arg-type]
        got_cnps = ProfileReuseSimulator._merged(me, CnpEvent, [], "cnps")  # type: ignore[arg-type]
        reads = 1  # write_network_files reads each once
    else:
        import phantora.netsim.reuse as R

        def merged(kind: str) -> Any:
            pick = getattr(R, "_shift_mark" if kind == "marks" else "_shift_cnp")
            shift = lambda r, t0, ids: [pick(e, t0, ids) for e in getattr(r, kind)]  # noqa: E731
            return ProfileReuseSimulator._merged(me, [], shift)  # type: ignore[arg-type,call-arg]

        got_marks, got_cnps = merged("marks"), merged("cnps")
        merged("marks"), merged("cnps")  # write_network_files read each twice: counted, then written
        reads = 2
    c1 = time.process_time()
    counts = (W.per_flow_counts(got_cnps), W.per_flow_counts(got_marks))
    c2 = time.process_time()
    with tempfile.TemporaryDirectory() as d:
        a = W.write_ecn_csv(Path(d) / "ecn_marks.csv", topo, got_marks)
        forks = [("ecn_marks.csv", time.process_time() - c2, children())]
        b = W.write_cnps_csv(Path(d) / "cnps.csv", topo, got_cnps)
        c3 = time.process_time()
        forks.append(("cnps.csv", c3 - c2 - forks[0][1], children()))
        digest = hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()[:12]
        size = a.stat().st_size + b.stat().st_size
        if args.completions:
            forks.append(flows_csv(Path(d), topo, args.completions))
    total = n * args.served
    print(f"# {total:,} CE marks and {total:,} CNPs ({args.served} served episodes of {n:,}), {topo.name}, "
          f"{'columns' if RecordColumns is not None else 'objects'}; files {size / 1e6:.0f} MB, sha-256 {digest}, "
          f"{len(counts[0]):,} flows counted")  # fmt: skip
    print(
        f"merge ({reads} read(s) each) {c1 - c0:.2f} CPU s, counts {c2 - c1:.2f}, files {c3 - c2:.2f}, "
        f"in all {c3 - c0:.2f} ({(c3 - c0) / (2 * total) * 1e9:.0f} ns a record)"
    )
    for name, cpu, kids in forks:
        each = " / ".join(f"{c:.2f}" for c in kids) or "none"
        print(f"{name}: this process {cpu:.2f} CPU s, its children {each}: {cpu + max(kids, default=0):.2f} s on free "
              f"cores, {cpu + sum(kids):.2f} CPU s in all")  # fmt: skip
    sys.stdout.flush()


def children() -> list[float]:
    """The CPU s of each process the last file's write forked (none in a tree without `phantora.results.forked`)."""
    try:
        from phantora.results.forked import last_child_cpu_s
    except ImportError:
        return []
    got = list(last_child_cpu_s)
    last_child_cpu_s.clear()
    return got


def flows_csv(d: Path, topo: Any, n: int) -> tuple[str, float, list[float]]:
    """flows.csv of `n` completions, each between two endpoints (2,048 pairs) on one of 4 ECMP keys, as a run's
    flows reuse a few connections' keys; its sha-256 printed."""
    from phantora.netsim.base import Completion, Flow

    eps = topo.endpoints
    pairs = [(eps[p % len(eps)], eps[(p * 7 + 1 + p // len(eps)) % len(eps)]) for p in range(2048)]
    flows = {i: Flow(i, *pairs[i % 2048], 65_536 + i % 4096, key=i % 4) for i in range(n)}
    done = [Completion(i, 1000 * i, 1000 * i + 40_000 + i % 977, f.size, f.src, f.dst, "c0/ring") for i, f in
            flows.items()]  # fmt: skip
    children()
    c0 = time.process_time()
    path = W.write_flows_csv(d / "flows.csv", topo, done, flows=flows)
    cpu = time.process_time() - c0
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    print(f"# flows.csv: {n:,} rows, {path.stat().st_size / 1e6:.0f} MB, sha-256 {digest}")
    return "flows.csv", cpu, children()


if __name__ == "__main__":
    main()
