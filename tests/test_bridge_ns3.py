"""The bridge with the ns-3 packet engine in its network server: exact mode equals the in-process replay.

Each run starts a network server process, which pays the ns-3 import once (tens of seconds on a
loaded machine), so there is one exact-mode test by default and the window test is `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from forked_replay import replay_ranks

from bridge.run import CosimRun
from phantora.collectives import AlgoOptions
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.packet_config import PacketConfig
from phantora.replay import replay_inprocess
from phantora.topology.generators import leaf_spine
from phantora.workload import load_workload

pytestmark = pytest.mark.ns3

WORKLOAD = {
    "name": "small-mix",
    "op": [
        {"name": "ar", "kind": "all_reduce", "bytes": "256KiB", "ranks": "all", "repeat": 2, "every": "10us"},
        {"name": "ag", "kind": "all_gather", "bytes": "128KiB", "ranks": "all", "after": ["ar.1"], "gap": "3us"},
        {"name": "p", "kind": "send_recv", "src": 0, "dst": 3, "bytes": "64KiB", "after": ["ar.1"], "gap": "1us"},
        {"name": "rs", "kind": "reduce_scatter", "bytes": "128KiB", "ranks": "all", "after": ["ag", "p"]},
    ],
}


def _setup(tmp_path: Path, ns3_lib):
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(WORKLOAD))
    wl = load_workload(path, world=topo.num_ranks)
    config = PacketConfig(cc="dcqcn")
    from phantora.netsim.packet import Ns3Simulator

    with Ns3Simulator(topo, config) as sim:
        ref = replay_inprocess(wl, topo, sim)
    exact = {op.name: (op.start_ns, op.end_ns, op.rank_done_ns) for op in ref.ops}
    return topo, path, config, exact


def _times(res) -> dict[str, tuple[int, int, dict[int, int]]]:
    return {r["name"]: (r["t_start"], r["end_ns"], dict(map(tuple, r["rank_done"]))) for r in res.collectives}


def test_exact_mode_with_ns3_equals_inprocess(tmp_path: Path, ns3_lib) -> None:
    topo, path, config, exact = _setup(tmp_path, ns3_lib)
    res = CosimRun(
        topo,
        EngineSpec("ns3", config),
        **replay_ranks(path),
        timeout_s=600,
    ).run()
    assert _times(res) == exact
    assert res.late_collectives == 0
    assert res.engine_stats["engine"] == "ns3"


@pytest.mark.slow
def test_window_mode_with_ns3_within_bound(tmp_path: Path, ns3_lib) -> None:
    topo, path, config, exact = _setup(tmp_path, ns3_lib)
    w = 10_000
    res = CosimRun(
        topo,
        EngineSpec("ns3", config, window_ns=w),
        **replay_ranks(path),
        timeout_s=600,
    ).run()
    depth = {"ar.0": 0, "ar.1": 1, "ag": 2, "p": 2, "rs": 3}
    got = _times(res)
    for name, (start, end, _) in exact.items():
        assert abs(got[name][0] - start) <= depth[name] * w
        assert abs(got[name][1] - end) <= depth[name] * w


class _Stepped:
    """An Ns3Simulator stepped one event time at a time (`step_watching`) instead of stopping ns-3 natively."""

    def __init__(self, sim) -> None:
        self.sim = sim

    def advance_watching(self, until: int, watch, earliest=None):
        from phantora.netsim.base import step_watching

        return step_watching(self, until, watch, earliest)

    def submit(self, flows, at: int) -> None:
        self.sim.submit(flows, at)

    def advance(self, until: int):
        return self.sim.advance(until)

    def next_event_time(self):
        return self.sim.next_event_time()

    def now(self) -> int:
        return self.sim.now()

    def in_flight(self) -> int:
        return self.sim.in_flight()


def _watch_trace(native: bool) -> list:
    """Stop at watched completions (incast under DCQCN), inject at each stop time; log everything."""
    from bridge.protocol import INF_NS
    from bridge.stepping import advance_watching
    from phantora.netsim.base import Flow
    from phantora.netsim.packet import Ns3Simulator

    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    eps = [n.id for n in topo.nodes if n.kind in ("gpu", "host")]
    with Ns3Simulator(topo, PacketConfig(cc="dcqcn")) as sim:
        eng = sim if native else _Stepped(sim)
        sizes = [40_000, 90_000, 90_000, 150_000, 260_000, 5_000]
        flows = [Flow(i, eps[1 + i % (len(eps) - 1)], eps[0], s) for i, s in enumerate(sizes)]
        flows.append(Flow(6, eps[0], eps[2], 70_000, deps=(1, 2), delay_ns=700))
        sim.submit(flows, at=0)
        log, nxt = [], 100
        for until, watch in [(2_000, {4}), (INF_NS, {2}), (INF_NS, {6}), (60_000, {4, 3}), (INF_NS, {0, 4})]:
            done = advance_watching(eng, until, watch)
            log.append((sim.now(), [(c.flow_id, c.start_ns, c.end_ns) for c in done]))
            if sim.in_flight():  # a woken rank injects at its wake time
                sim.submit([Flow(nxt, eps[2], eps[0], 30_000), Flow(nxt + 1, eps[3], eps[1], 12_000)], at=sim.now())
                nxt += 2
        log.append((sim.drain(), sim.now()))
    return log


def test_native_advance_watching_equals_stepping(ns3_lib) -> None:
    native, stepped = _watch_trace(True), _watch_trace(False)
    assert native == stepped
    assert native[0][1] == [] and native[0][0] == 2_000
    assert all(any(fid in {2, 6, 3, 4} for fid, _, _ in done) for _, done in native[1:4])


def test_an_advance_longer_than_the_peer_timeout_is_not_silence(tmp_path: Path, ns3_lib) -> None:
    """Regression: the server took its own busy time in a long ns-3 advance for the coordinator's silence.

    One 8-rank ring all-reduce of 1 GiB is a single advance of several CPU seconds (512 MiB took 3.8 CPU s on a quiet
    machine, under the timeout it must outlast; 8.4 at load 15); the peer timeout
    is 4 s (the ranks hear the coordinator's heartbeat about once a second: 2 s left too little slack on a loaded
    machine). The run must finish, and in no less than the ring's closed-form time at line rate.
    """
    topo = leaf_spine(1, 8, 0, nic_rate="100Gbps", latency="1us")
    size = 1 << 30
    peer_s = 4.0
    path = tmp_path / "wl.json"
    path.write_text(
        json.dumps({"name": "big", "op": [{"name": "ar", "kind": "all_reduce", "bytes": size, "ranks": "all"}]})
    )
    res = CosimRun(
        topo,
        EngineSpec("ns3", PacketConfig(cc="dcqcn")),
        **replay_ranks(path),
        peer_timeout_s=peer_s,
        timeout_s=600,
    ).run()
    (op,) = res.collectives
    ring_ns = 2 * 7 / 8 * size * 8 / 100e9 * 1e9
    assert op["end_ns"] - op["t_start"] >= ring_ns
    assert res.engine_stats["server_cpu_s"] > peer_s, "the advance must outlast the peer timeout to test anything"


def _live_run(tmp_path: Path, topo, config: PacketConfig, algo: AlgoOptions | None = None):
    """The small mixed workload, live over the ns-3 server in exact mode, results written to tmp_path/run."""
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "run"
    res = CosimRun(
        topo,
        EngineSpec("ns3", config),
        **replay_ranks(path),
        timeout_s=600,
        out_dir=out,
        algo=algo,
    ).run()
    return res, out


def test_live_run_fills_the_transport_columns(tmp_path: Path, ns3_lib) -> None:
    """A sprayed run with the SACK receiver: flows.csv's transport columns are filled, and they add up to the
    engine's own totals (results.json's engine counters), which show reordering. The collectives run at line rate
    (the ideal model): NCCL's throughput caps and latencies space the flows out, and whether they then meet in a
    queue, which reordering needs, would hang on the model's microseconds."""
    import csv

    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    config = PacketConfig(cc="dcqcn", lb="spray", rx="sack")
    res, out = _live_run(tmp_path, topo, config, AlgoOptions(model="ideal"))
    with (out / "flows.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and all(r["ooo_packets"] != "" and r["retx_packets"] != "" for r in rows)
    stats = res.engine_stats
    assert stats["ooo_packets"] > 0
    for col in ("retx_packets", "retx_bytes", "ooo_packets"):
        assert sum(int(r[col]) for r in rows) == stats[col], col
    assert max(int(r["reorder_max_bytes"]) for r in rows) == stats["reorder_max_bytes"]


def test_a_run_waits_for_the_server_to_write_long_traces(tmp_path: Path, ns3_lib) -> None:
    """Queue samples every ns make the server's traces take longer to write than the children's stop grace:
    the run still ends with every trace file, written to the end of the run (they used to be lost silently)."""
    import csv

    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    res, out = _live_run(tmp_path, topo, PacketConfig(cc="dcqcn", queue_sample_ns=1))
    for name in ("queues.csv", "links.csv", "ecn_marks.csv", "cnps.csv", "drops.csv"):
        assert (out / name).is_file(), name
    assert "wrote the engine's traces" in (out / "logs" / "server.log").read_text()
    with (out / "queues.csv").open() as fh:
        last = max(int(row["time_ns"]) for row in csv.DictReader(fh))
    assert last >= 0.9 * res.makespan_ns
