"""How long the launcher takes to merge the ranks' trace chunks into trace.json, against the trace's size.

A failed run merges its partial trace before the launcher exits, and a finished one at its end, so this time is
part of "a rank that dies takes the run down within seconds". The ranks' chunks are written by the real recorder
(`TraceRecorder.append_to`); the streamed merge (`run_dir.merge_trace`) is timed beside a whole-document JSON
round trip of the same chunks (every line parsed, the document dumped at once: the merge before 2026-12-03).

    .venv/bin/python bench/bench_trace_merge.py --ranks 4 --steps 400 --ops 2000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's phantora, not another install

from phantora.results import run_dir
from phantora.runtime.trace import TraceRecorder


def write_chunks(out: Path, ranks: int, steps: int, ops: int, comms: int) -> int:
    """The ranks' trace chunks of `steps` steps of `ops` compute ops and `comms` collectives; their bytes."""
    for rank in range(ranks):
        r = TraceRecorder(rank)
        t = 0
        for step in range(steps):
            start = t
            for i in range(ops):
                r.op(f"aten.op{i % 37}", t, t + 1_000)
                t += 1_000
            for c in range(comms):
                r.comm(f"all_reduce#{step * comms + c}", t, t + 5_000, {"bytes": 1 << 20, "group": list(range(ranks))})
                t += 5_000
            r.step(step, start, t)
            r.append_to(out / "trace" / f"rank{rank}.jsonl", step)
    return sum(p.stat().st_size for p in (out / "trace").iterdir())


def round_trip(out: Path) -> float:
    """The whole-document merge: every chunk parsed, the document dumped at once; its seconds."""
    t0 = time.perf_counter()
    chunks = run_dir.rank_trace(out)
    events = [ev for r in sorted(chunks) for c in chunks[r] for ev in c["events"]]
    (out / "whole.json").write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    return time.perf_counter() - t0


def streamed(out: Path, with_args: bool) -> float:
    """`run_dir.merge_trace`, partial (no args) or with an NCCL choice on every collective span; its seconds."""
    args: dict[tuple[int, str, tuple[int, ...] | None], dict[str, Any]] = {}
    if with_args:
        args = {(r, f"all_reduce#{k}", None): {"nccl": {"algorithm": "Ring"}} for r in range(8) for k in range(9999)}
    t0 = time.perf_counter()
    run_dir.merge_trace(out, partial=not with_args, comm_args=args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ops", type=int, default=2000, help="compute ops a step")
    ap.add_argument("--comms", type=int, default=8, help="collectives a step")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="phantora-bench-trace-"))
    try:
        print(f"{'merge':<34} {'MB':>8} {'s':>8} {'MB/s':>8}")
        for name in ("whole-document round trip", "streamed, partial (failed run)", "streamed, NCCL args (finished)"):
            out = root / name.split()[0]
            mb = write_chunks(out, a.ranks, a.steps, a.ops, a.comms) / 1e6
            if name.startswith("whole"):
                s = round_trip(out)
            else:
                s = streamed(out, with_args="args" in name)
            print(f"{name:<34} {mb:>8.1f} {s:>8.2f} {mb / s:>8.1f}")
            shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
