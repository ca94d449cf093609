"""One barrier exchange between partition workers, alone (issue 38): CPU and wall per exchange. Prints figures only.

N processes (`--workers`, default 2) each open the peers of a partition worker in one run directory and exchange
`--rounds` times with every peer a batch of each `--payload` size (0: the report of a window with no cut-cable
message), after 50 warm-up exchanges: `bridge.cut_peers.ZmqPeers` (ZeroMQ over ipc, msgpack; what workers on one
machine used until 2026-11-30, and still use over tcp / CurveZMQ), `bridge.cut_unix.UnixPeers` from Python (Unix
stream sockets, `bridge.cut_frame`'s length-prefixed msgpack frames; the Python window loop's,
``PHANTORA_CUT_LOOP=python``) and the same sockets under the C++ window loop's exchange (``native``:
``ns3::PhantoraCutExchangeRounds``, the barriers with no Python call between; what local workers run since
2c13f6f), alternating `--repeat` times so the machine's load falls on all alike. Per transport and size: the median
over the repeats of the mean CPU of one exchange per worker (process CPU: ZeroMQ's I/O thread is in it) and of its
wall (on a loaded machine mostly waiting for a core). No window runs: the exchange alone.

    .venv/bin/python bench/bench_cut_exchange.py --payload 0 64 4096 65536
    .venv/bin/python bench/bench_cut_exchange.py --workers 16 --payload 0 --kinds native zmq
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
peers = (ZmqPeers if kind == "zmq" else UnixPeers)(root, g, n, token)
if kind == "native":  # the C++ loop's barriers, none of them a Python call
    from phantora.netsim.packet import load_ns3
    load_ns3(build_if_needed=False)
    peers.exchange_rounds(0, 50, size)
    cpu, wall = peers.exchange_rounds(50, k, size)
else:
    batch = {p: bytes(size) for p in range(n) if p != g}
    for i in range(50):
        peers.exchange(i, 100 * i, 100 * i + 1000, batch)
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(50, 50 + k):
        reports = peers.exchange(i, 100 * i, 100 * i + 1000, batch)
        assert len(reports) == n - 1 and all(len(r.batch) == size and r.next_ns == 100 * i for r in reports)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
print(cpu / k, wall / k)
peers.close()
"""
KINDS = ("zmq", "unix", "native")  # ZeroMQ; Unix sockets from Python; from C++


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
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="the transports to measure")
    ap.add_argument("--payload", type=int, nargs="+", default=[0, 64, 4096, 65536], help="bytes to each peer")
    args = ap.parse_args()
    print(f"# {args.workers} workers, {args.rounds} exchanges each, median of {args.repeat} alternating runs")
    kinds = args.kinds
    names = {"zmq": "ZeroMQ", "unix": "Unix from Python", "native": "C++ loop"}
    cols = [f"{names[k]} {what} us" for what in ("CPU", "wall") for k in kinds]
    print("| payload B | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for size in args.payload:
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for kind in kinds:
                got[kind].append(exchange(kind, args.workers, size, args.rounds))
        cpu = [1e6 * statistics.median(c for c, _ in got[k]) for k in kinds]
        wall = [1e6 * statistics.median(w for _, w in got[k]) for k in kinds]
        print(f"| {size:,} | " + " | ".join(f"{v:.1f}" for v in cpu + wall) + " |")


if __name__ == "__main__":
    main()
