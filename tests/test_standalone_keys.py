"""A live run's standalone FCT takes the path the flow's own ECMP key picks, not its id's.

An NCCL flow's ECMP key is its connection's (`phantora.collectives.dag.ecmp_key`), not its flow id. On a fabric whose
two ECMP paths differ (a 100G path and a 25G one of longer links), a lone send's flow runs alone on the path its key
picks: its FCT is that path's closed form, and so must be the standalone FCT flows.csv divides by. Before the
coordinator carried each completion's key (`CompletionLog`, the outcome's `completion_alone`), flows.csv routed the
flow by its id, here onto the other path, and reported a slowdown of about 0.26.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from bridge.run import CosimRun
from phantora.netsim.base import Completion
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.standalone import Alone, standalone_fct_ns
from phantora.results.scenario import completion_rows
from phantora.topology import load_topology
from phantora.topology.model import Topology

G = 10**9
US = 1000
SIZE = 1 << 20  # 1 MiB
FAST_NS = -(-SIZE * 8 * G // (100 * G)) + 4 * US  # four 1 us hops at 100G: 87,887 ns
SLOW_NS = -(-SIZE * 8 * G // (25 * G)) + (1 + 3 + 3 + 1) * US  # through `slow`: 25G, two 3 us links: 343,545 ns

# a -> L -> {fast, slow} -> R -> b: two equal-cost paths, 100G / 1 us links through `fast`, 25G / 3 us through `slow`
ASYM = """
name = "asym2"
gpu = "H100"
[link_defaults]
latency = "1us"
rate = "100Gbps"
[[nodes]]
name = "a"
kind = "gpu"
host = 0
[[nodes]]
name = "b"
kind = "gpu"
host = 1
[[nodes]]
name = "L"
kind = "switch"
tier = 1
[[nodes]]
name = "R"
kind = "switch"
tier = 1
[[nodes]]
name = "fast"
kind = "switch"
tier = 2
[[nodes]]
name = "slow"
kind = "switch"
tier = 2
[[links]]
a = "a"
b = "L"
[[links]]
a = "b"
b = "R"
[[links]]
a = "L"
b = "fast"
[[links]]
a = "fast"
b = "R"
[[links]]
a = "L"
b = "slow"
rate = "25Gbps"
latency = "3us"
[[links]]
a = "slow"
b = "R"
rate = "25Gbps"
latency = "3us"
"""


def asym(tmp_path: Path) -> Topology:
    path = tmp_path / "asym2.toml"
    path.write_text(ASYM)
    return load_topology(str(path))


def via(topo: Topology, key: int) -> str:
    """The middle switch the path of flow key `key` from a to b goes through."""
    names = {topo.channel_ends(ch)[1]: topo.nodes[topo.channel_ends(ch)[1]].name for ch in topo.route(0, 1, key)}
    (mid,) = {n for n in names.values() if n in ("fast", "slow")}
    return mid


def live_send(tmp_path: Path, topo: Topology, engine: EngineSpec) -> tuple[dict[str, str], dict[int, Alone]]:
    """One 1 MiB send from a to b, live (rank processes replaying a one-op workload): its flows.csv row and the
    keys and caps the run carried."""
    wl = tmp_path / "wl.json"
    op = {"name": "p", "kind": "send_recv", "src": 0, "dst": 1, "bytes": "1MiB"}
    wl.write_text(json.dumps({"name": "lone", "op": [op]}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", str(wl)]
    res = CosimRun(topo, engine, rank_cmd=cmd, timeout_s=300, out_dir=out).run()
    with (out / "flows.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))  # a lone flow
    return row, res.alone


def test_the_fabric_tells_the_paths_apart(tmp_path: Path) -> None:
    """The closed forms differ, and the scenario tables (`completion_rows`) take each: by the key when given, by the
    id otherwise (flow 0 hashes onto `slow`, the NCCL connection's key of a -> b channel 0 onto `fast`)."""
    topo = asym(tmp_path)
    key = (0 << 48) | (0 << 24) | 1  # ecmp_key(a, b, channel 0), restated
    assert (via(topo, 0), via(topo, key)) == ("slow", "fast")
    done = [Completion(0, 0, FAST_NS, SIZE, 0, 1)]
    assert completion_rows(topo, done, {0: Alone(key)}) == [(SIZE, FAST_NS, FAST_NS)]
    assert completion_rows(topo, done) == [(SIZE, FAST_NS, SLOW_NS)]


def test_a_live_flows_standalone_fct_is_its_keys_path_in_flow_mode(tmp_path: Path) -> None:
    """Alone and uncontended (its NCCL cap, above 100G, does not bind), the flow's FCT is the fast path's closed
    form, and so is its standalone FCT: slowdown 1. Its id (0) would route it through `slow` (343,545 ns)."""
    topo = asym(tmp_path)
    row, alone = live_send(tmp_path, topo, EngineSpec("flow"))
    fid = int(row["flow_id"])
    assert via(topo, alone[fid].key) == "fast" and via(topo, fid) == "slow"
    assert alone[fid].rate_bps == int(row["rate_cap_bps"]) > 100 * G
    assert int(row["fct_ns"]) == FAST_NS
    assert int(row["standalone_fct_ns"]) == FAST_NS
    assert float(row["slowdown"]) == 1.0


@pytest.mark.ns3
@pytest.mark.slow  # the network server's ns-3 import: about 10 s at load 19
def test_a_live_flows_standalone_fct_is_its_keys_path_in_ns3(tmp_path: Path, ns3_lib) -> None:
    """ns-3 hashes the same key: the flow's FCT lies between the fast path's fluid form and HPCC's framed form of it
    (headers, a base RTT), far under the slow path's; flows.csv's standalone FCT is the fast path's fluid form."""
    from phantora.netsim.packet_config import PacketConfig

    topo = asym(tmp_path)
    cfg = PacketConfig()
    row, alone = live_send(tmp_path, topo, EngineSpec("ns3", cfg))
    fid = int(row["flow_id"])
    framed = standalone_fct_ns(topo, 0, 1, SIZE, alone[fid].key, (cfg.payload_bytes, cfg.header_bytes))
    assert FAST_NS <= int(row["fct_ns"]) <= framed
    assert int(row["standalone_fct_ns"]) == FAST_NS
