"""Decomposition workers connected in the background (issue 38, item 2): `spawn_workers` returns once the worker
processes are started, before their hellos (each worker imports and builds ns-3 first), so the caller's first submit
runs beside their start; the first request waits for every hello, and a pool closed while they start ends them."""

from __future__ import annotations

import time

from bridge.workers import spawn_workers
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.generators import rail_optimized

SETTINGS = {"cc": "dcqcn", "nvlink": "fluid", "nic_latency": 1000, "payload_bytes": 4096, "header_bytes": 62}


def _pool():  # type: ignore[no-untyped-def]
    topo = rail_optimized(3, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="rail-3x2")
    return spawn_workers(topo, PacketConfig(**SETTINGS, workers=1), [[0, 1]])  # (one worker: both rails)


def test_the_pool_returns_before_the_workers_hello_and_the_first_request_waits_for_them() -> None:
    pool = _pool()
    try:
        assert all(w.remote is None for w in pool.workers)  # started, not connected: their engines are being built
        assert pool.starting and pool.waited_s == 0.0  # (a large first submit keeps its books now: decompose.py)
        assert pool.stats(0)["server_cpu_s"] >= 0.0  # the first request: every worker's hello first
        assert all(w.remote is not None for w in pool.workers) and not pool.starting
        assert pool.waited_s > 0.0
    finally:
        pool.close()


def test_a_pool_closed_while_its_workers_start_ends_them() -> None:
    pool = _pool()
    procs = [w.proc for w in pool.workers]
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 10.0  # (not the start-up timeout: the connecting thread sees them die)
    assert all(p is not None and p.poll() is not None for p in procs)
