"""The cost of CurveZMQ on bridge sockets (`bridge.curve`): round trips with and without it. Prints figures only.

Two measures, each plain tcp and CURVE side by side on loopback, alternated so that the machine's load hits
both alike (the ratio is the figure; this machine is shared):
- ``echo``: a DEALER/ROUTER echo (the bridge's socket types and options) at several message sizes: wall and
  CPU (both ends are in this process) per round trip;
- ``server``: a real network server (``python -m bridge.netserver``, flow engine) asked ``get_stats`` through
  `RemoteSimulator`, as a decomposition driver asks its workers: wall per request.

    .venv/bin/python bench/bench_curve.py --sizes 100 65536 1048576 --server-calls 2000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.curve import CLIENTS_ENV, ClientCurve, KeyPair, ServerCurve, start_authenticator  # noqa: E402
from bridge.remote import RemoteSimulator  # noqa: E402
from bridge.runspec import RunSpec  # noqa: E402
from bridge.transport import bind_router, connect_dealer, make_run_dir, new_token, read_server_key  # noqa: E402
from phantora.topology.generators import rail_optimized  # noqa: E402


def echo(curve: bool, size: int, n: int) -> tuple[float, float]:
    """(wall s, CPU s) per round trip of a `size`-byte message, after one warm-up."""
    ctx = zmq.Context()
    server = ServerCurve(KeyPair.new(), frozenset()) if curve else None
    client = KeyPair.new()
    auth = start_authenticator(ctx, frozenset({client.public})) if curve else None
    router, endpoint = bind_router(ctx, "tcp://127.0.0.1:*", max(size, 1 << 20), server)
    dealer = connect_dealer(ctx, endpoint, curve=ClientCurve(client, server.keys.public) if server else None)

    def serve() -> None:
        for _ in range(n + 1):
            router.send_multipart(router.recv_multipart())

    t = threading.Thread(target=serve)
    t.start()
    msg = b"x" * size
    dealer.send(msg)
    dealer.recv()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        dealer.send(msg)
        dealer.recv()
    wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
    t.join()
    dealer.close(0)
    router.close(0)
    if auth is not None:
        auth.stop()
    ctx.term()
    return wall, cpu


def server_calls(curve: bool, n: int) -> float:
    """Wall s per `get_stats` request to a real network server over loopback tcp."""
    run_dir = make_run_dir()
    token = new_token()
    topo = rail_optimized(2, 1, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="pair")
    setup = run_dir / "setup.msgpack"
    setup.write_bytes(RunSpec(topology=topo, world=topo.num_ranks).to_bytes())
    client = KeyPair.new()
    env = {**os.environ, "PHANTORA_TOKEN": token, "PYTHONPATH": str(ROOT)}
    env.pop(CLIENTS_ENV, None)
    if curve:
        env[CLIENTS_ENV] = client.public.decode()
    argv = [sys.executable, "-m", "bridge.netserver", "--setup", str(setup), "--transport", "tcp"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = zmq.Context()
    try:
        while not (run_dir / "net.endpoint").exists():
            time.sleep(0.02)
        endpoint = (run_dir / "net.endpoint").read_text()
        key = read_server_key(run_dir, "net")
        cc = ClientCurve(client, key) if key is not None else None
        sim = RemoteSimulator(ctx, endpoint, token, startup_timeout_s=60, call_timeout_s=60, curve=cc)
        sim.stats()
        t0 = time.perf_counter()
        for _ in range(n):
            sim.stats()
        wall = (time.perf_counter() - t0) / n
        sim.close()
    finally:
        proc.wait(10)
        ctx.term()
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 65536, 1 << 20])
    ap.add_argument("--bytes-per-size", type=int, default=256 << 20, help="traffic per size and variant")
    ap.add_argument("--server-calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'echo bytes':>10} {'plain us':>9} {'curve us':>9} {'wall x':>7} {'plain CPU us':>12} {'curve CPU us':>12} "
          f"{'CPU x':>6}")  # fmt: skip
    for size in args.sizes:
        n = max(200, min(5000, args.bytes_per_size // max(size, 1)))
        plain, curve = [], []
        for _ in range(args.repeats):  # alternate, keep the best of each: the least disturbed by other jobs
            plain.append(echo(False, size, n))
            curve.append(echo(True, size, n))
        p, c = min(plain), min(curve)
        print(f"{size:>10} {1e6 * p[0]:>9.1f} {1e6 * c[0]:>9.1f} {c[0] / p[0]:>7.2f} {1e6 * p[1]:>12.1f} "
              f"{1e6 * c[1]:>12.1f} {c[1] / p[1]:>6.2f}")  # fmt: skip
    if args.server_calls:
        walls: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for curve_on in (False, True):
                walls[curve_on].append(server_calls(curve_on, args.server_calls))
        sp, sc = min(walls[False]), min(walls[True])
        print(f"netserver get_stats: plain {1e6 * sp:.1f} us, curve {1e6 * sc:.1f} us per request ({sc / sp:.2f}x)")


if __name__ == "__main__":
    main()
