"""What reuse=on can save on a step, read from a flow-mode replay (issue 38). Prints figures only.

Under ``--set reuse=on`` ns-3 runs each stretch of packet-side traffic from a quiet fabric to the next (an
episode) once per shape and serves its repeats (docs/packet-model.md, "Reuse of repeated completion profiles").
This reads the flows.csv of a flow-mode replay of the same graph (``phantora replay G --topology T --out DIR``),
keeps the flows the packet side carries under ``nvlink=fluid`` (ends on different NVSwitch domains), merges
their [start, end] intervals into busy periods, groups the periods by shape (flows, bytes, duration in us) and
prints: the periods, the shapes, and the share of packet-side bytes in the first period of each shape (what ns-3
still runs when every repeat is served). With ``--off-cpu S`` it also prints S times that share: the run CPU
reuse=on would take, on paper, from a measured reuse-off run CPU S.

    .venv/bin/phantora replay G --topology leafspine1024 --out /tmp/flow1024
    .venv/bin/python bench/bench_episodes.py /tmp/flow1024/flows.csv --topology leafspine1024 --off-cpu 8443

The periods are flow mode's; packet mode's episodes end where its own fabric falls quiet, so this is a
projection: compare the period count with the ``reuse_episodes`` of a packet run where one exists.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.errors import InputError
from phantora.topology.loader import load_topology


@dataclass(frozen=True)
class Period:
    """One busy period of the packet side: from its first flow's start to the last end of overlapping flows."""

    start_ns: int
    end_ns: int
    flows: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """Flows, bytes and duration in whole us: periods with equal shapes are taken as repeats."""
        return (self.flows, self.nbytes, round((self.end_ns - self.start_ns) / 1000))


def busy_periods(intervals: Iterable[tuple[int, int, int]]) -> list[Period]:
    """Merge (start_ns, end_ns, bytes) intervals into busy periods; touching intervals (end == start) merge."""
    out: list[Period] = []
    cur: list[int] | None = None  # start, end, flows, bytes
    for s, e, b in sorted(intervals):
        if cur is not None and s <= cur[1]:
            cur[1] = max(cur[1], e)
            cur[2] += 1
            cur[3] += b
            continue
        if cur is not None:
            out.append(Period(*cur))
        cur = [s, e, 1, b]
    if cur is not None:
        out.append(Period(*cur))
    return out


def first_of_shape_share(periods: list[Period]) -> float:
    """Share of all bytes that lie in the first period of each shape (the rest repeat an earlier period)."""
    seen: set[tuple[int, int, int]] = set()
    first = 0
    for p in periods:
        if p.shape not in seen:
            seen.add(p.shape)
            first += p.nbytes
    total = sum(p.nbytes for p in periods)
    return first / total if total else 0.0


def packet_side_intervals(path: str, topo_name: str) -> list[tuple[int, int, int]]:
    """(start_ns, end_ns, bytes) of the flows of `path` (a flows.csv) that cross NVSwitch domains."""
    topo = load_topology(topo_name)
    out = []
    with open(path, newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), start=2):
            try:
                src, dst, size = int(row["src_id"]), int(row["dst_id"]), int(row["size_bytes"])
                start, end = int(row["start_ns"]), int(row["end_ns"])
            except (KeyError, ValueError) as exc:
                raise InputError(f"not a flows.csv row ({exc})", file=path, line=n) from exc
            if size == 0 or src == dst or topo.shared_nvswitch(src, dst) is not None:
                continue
            out.append((start, end, size))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("flows_csv", help="flows.csv of a flow-mode replay")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--off-cpu", type=float, help="measured or projected reuse-off run CPU s of the packet run")
    args = ap.parse_args()
    periods = busy_periods(packet_side_intervals(args.flows_csv, args.topology))
    total = sum(p.nbytes for p in periods)
    print(f"{len(periods)} busy periods, {sum(p.flows for p in periods)} packet-side flows, {total / 1e9:.1f} GB")
    for shape, n in Counter(p.shape for p in periods).most_common():
        print(f"  {n:>4} x  flows={shape[0]}  GB={shape[1] / 1e9:.2f}  duration={shape[2]} us")
    share = first_of_shape_share(periods)
    print(f"first period of each shape: {100 * share:.2f} % of the packet-side bytes (ns-3's share under reuse=on)")
    if args.off_cpu is not None:
        print(f"on paper with reuse=on: {args.off_cpu * share:.0f} run CPU s (reuse off: {args.off_cpu:.0f})")


if __name__ == "__main__":
    main()
