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
        b = W.write_cnps_csv(Path(d) / "cnps.csv", topo, got_cnps)
        c3 = time.process_time()
        digest = hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()[:12]
        size = a.stat().st_size + b.stat().st_size
    total = n * args.served
    print(f"# {total:,} CE marks and {total:,} CNPs ({args.served} served episodes of {n:,}), {topo.name}, "
          f"{'columns' if RecordColumns is not None else 'objects'}; files {size / 1e6:.0f} MB, sha-256 {digest}, "
          f"{len(counts[0]):,} flows counted")  # fmt: skip
    print(
        f"merge ({reads} read(s) each) {c1 - c0:.2f} CPU s, counts {c2 - c1:.2f}, files {c3 - c2:.2f}, "
        f"in all {c3 - c0:.2f} ({(c3 - c0) / (2 * total) * 1e9:.0f} ns a record)"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
