"""One barrier exchange between partition workers, alone (issue 38): CPU and wall per exchange. Prints figures only.

N processes (`--workers`, default 2) each open the peers of a partition worker in one run directory and exchange
`--rounds` times with every peer a batch of each `--payload` size (0: the report of a window with no cut-cable
message), after 50 warm-up exchanges: `bridge.cut_peers.ZmqPeers` (ZeroMQ over ipc, msgpack; what workers on one
machine used until 2026-11-30, and still use over tcp / CurveZMQ) and `bridge.cut_unix.UnixPeers` (Unix stream
sockets, `bridge.cut_frame`'s length-prefixed msgpack frames), alternating `--repeat` times so the machine's load
falls on both alike. Per transport and size: the median over the repeats of the mean CPU of one exchange per worker
(`time.process_time`: ZeroMQ's I/O thread is in it) and of its wall (on a loaded machine mostly waiting for a core).
No ns-3: the exchange alone.

    .venv/bin/python bench/bench_cut_exchange.py --payload 0 64 4096 65536
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's bridge, not the venv's install

from bridge.transport import make_run_dir, new_token, remove_run_dir

SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bridge.cut_peers import ZmqPeers
from bridge.cut_unix import UnixPeers
kind, root, g, n, token = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
k, size = int(sys.argv[7]), int(sys.argv[8])
peers = (UnixPeers if kind == "unix" else ZmqPeers)(root, g, n, token)
batch = {p: bytes(size) for p in range(n) if p != g}
for i in range(50):
    peers.exchange(i, 100 * i, 100 * i + 1000, batch)
c0, w0 = time.process_time(), time.perf_counter()
for i in range(50, 50 + k):
    reports = peers.exchange(i, 100 * i, 100 * i + 1000, batch)
    assert len(reports) == n - 1 and all(len(r.batch) == size and r.next_ns == 100 * i for r in reports)
print((time.process_time() - c0) / k, (time.perf_counter() - w0) / k)
peers.close()
"""
KINDS = ("zmq", "unix")


def exchange(kind: str, n: int, size: int, rounds: int) -> tuple[float, float]:
    """(mean CPU s, mean wall s) of one exchange per worker: `n` workers, `size` bytes to each peer."""
    root, token = make_run_dir(), new_token()
    tree = str(Path(__file__).resolve().parents[1])
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT, tree, kind, str(root), str(g), str(n), token, str(rounds), str(size)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for g in range(n)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a {kind} exchange worker failed: {[p.returncode for p in procs]}")
        figs = [[float(x) for x in out.split()] for out in outs]
    finally:
        remove_run_dir(root)
    return sum(c for c, _ in figs) / n, sum(w for _, w in figs) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--payload", type=int, nargs="+", default=[0, 64, 4096, 65536], help="bytes to each peer")
    args = ap.parse_args()
    print(f"# {args.workers} workers, {args.rounds} exchanges each, median of {args.repeat} alternating runs")
    print("| payload B | ZeroMQ CPU us | Unix CPU us | ZeroMQ wall us | Unix wall us |")
    print("|---:|---:|---:|---:|---:|")
    for size in args.payload:
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for _ in range(args.repeat):
            for kind in KINDS:
                got[kind].append(exchange(kind, args.workers, size, args.rounds))
        cpu = {k: 1e6 * statistics.median(c for c, _ in v) for k, v in got.items()}
        wall = {k: 1e6 * statistics.median(w for _, w in v) for k, v in got.items()}
        print(f"| {size:,} | {cpu['zmq']:.1f} | {cpu['unix']:.1f} | {wall['zmq']:.1f} | {wall['unix']:.1f} |")


if __name__ == "__main__":
    main()
