"""Sample a process tree every few seconds: its summed RSS and PSS, and each process's CPU and peak RSS as last seen.

For a long command whose processes come and go (partition workers, fluid shard processes, results writers forked by
the driver): `/usr/bin/time -v` gives the tree's CPU but only its largest process's peak RSS. Run it beside the
command, given the command's pid (e.g. `/usr/bin/time`'s):

    .venv/bin/python bench/sample_tree.py PID OUT.json --every 10

OUT.json is rewritten after each sample (the peak sums, when, and per pid: command, CPU s, RSS, peak RSS);
OUT.json.samples gets a line a sample: unix time, processes, summed RSS kB, summed PSS kB, summed CPU s last seen.
A process's CPU is its last sample's (a process that ends between two samples loses at most one period of it).
Used for docs/packet-model.md, "The 1024-GPU step run to the end with the shards in processes".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(root: int) -> list[int]:
    """`root` and every descendant."""
    kids, out, todo = children(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def probe(pid: int) -> tuple[float, int, int, str] | None:
    """A process's CPU s (user + system), RSS and PSS in kB, and command line; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        rss = pss = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return cpu, rss, pss, cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pid", type=int, help="the tree's root process")
    ap.add_argument("out", type=Path, help="JSON written after each sample (OUT.samples: a line a sample)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples (default 10)")
    args = ap.parse_args()
    seen: dict[int, dict[str, Any]] = {}
    peak: dict[str, Any] = {"rss_kb": 0, "pss_kb": 0, "rss_at": None, "pss_at": None, "processes": 0}
    with open(f"{args.out}.samples", "w") as log:
        while os.path.exists(f"/proc/{args.pid}"):
            now = time.time()
            rss = pss = 0
            pids = tree(args.pid)
            for p in pids:
                got = probe(p)
                if got is None:
                    continue
                cpu, r, s, cmd = got
                rss, pss = rss + r, pss + s
                e = seen.setdefault(p, {"cmd": cmd, "first": now, "peak_rss_kb": 0})
                e.update(cpu_s=cpu, last=now, rss_kb=r, peak_rss_kb=max(e["peak_rss_kb"], r))
            if rss > peak["rss_kb"]:
                peak.update(rss_kb=rss, rss_at=now, processes=len(pids))
            if pss > peak["pss_kb"]:
                peak.update(pss_kb=pss, pss_at=now)
            log.write(f"{now:.0f} {len(pids)} {rss} {pss} {sum(e['cpu_s'] for e in seen.values()):.1f}\n")
            log.flush()
            args.out.write_text(json.dumps({"peak": peak, "procs": {str(k): v for k, v in seen.items()}}))
            time.sleep(args.every)


if __name__ == "__main__":
    main()
