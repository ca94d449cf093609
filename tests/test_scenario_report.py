"""The scenario's results (issue 36): slowdown buckets, before/during/after phases, and a replay's results.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from phantora.results.scenario import fct_slowdown_buckets, phases


def test_buckets_and_phases_closed_forms() -> None:
    rows = [(5_000, 200, 100), (5_000, 400, 100), (50_000, 1000, 1000), (20_000_000, 3000, 1000), (1, 5, 0)]
    b = {r["bucket"]: r for r in fct_slowdown_buckets(rows)}
    assert b["<10KB"]["flows"] == 2 and b["<10KB"]["median"] == 3.0 and b["<10KB"]["mean"] == 3.0
    assert b["10KB-100KB"]["p99"] == 1.0 and b[">=10MB"]["median"] == 3.0 and b["1MB-10MB"]["flows"] == 0
    spans = [(0, 10), (10, 30), (30, 40), (40, 46)]
    assert phases(spans, 15, 35) == {
        "before": {"count": 1, "mean_ns": 10.0},
        "during": {"count": 2, "mean_ns": 15.0},
        "after": {"count": 1, "mean_ns": 6.0},
    }
    assert phases(spans, 35, None)["during"] == {"count": 2, "mean_ns": 8.0}


def test_replay_with_a_scenario_writes_its_section(tmp_path: Path) -> None:
    topo = tmp_path / "ls.toml"
    topo.write_text(
        '[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 2\nspines = 2\nnic_rate = "100Gbps"\n'
        "nvswitch = false\n"
    )
    sc = tmp_path / "sc.toml"
    sc.write_text(
        'reconvergence = "10us"\n[[events]]\nkind = "link_down"\nat = "11ms"\nduration = "3ms"\n'
        'link = ["leaf0", "spine0"]\n[[events]]\nkind = "background"\nat = "0ns"\nduration = "5ms"\n'
        'cdf = "hadoop"\nload = 0.2\n'
    )
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "phantora.cli", "replay", "ddp_buckets", "--topology", str(topo)]
    cmd += ["--scenario", str(sc), "--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = json.loads((out / "results.json").read_text())["scenario"]
    assert [a["op"] for a in res["applied"][:2]] == ["down", "reroute"]
    assert res["applied"][1]["t_ns"] == 11_010_000 and res["applied"][0]["links"] == ["leaf0-spine0"]
    ph = res["events"][0]["ops"]
    assert ph["before"]["count"] + ph["during"]["count"] + ph["after"]["count"] == 12
    assert res["background"]["flows"] > 0 and any(r["flows"] for r in res["fct_slowdown_background"])
    assert (out / "scenario_steps.png").exists() and (out / "scenario_steps.svg").exists()


def test_a_network_server_reports_what_its_scenario_engine_did() -> None:
    """`get_scenario` (a live run's engine in a network server): the link actions applied, the background flows
    done and their slowdown table, over the wire; {} from an engine without a scenario."""
    from bridge.netserver import NetServer
    from bridge.protocol import decode, encode
    from phantora.netsim.base import Flow
    from phantora.netsim.faults import FaultyFlowSimulator
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.scenario import parse_scenario
    from phantora.topology.generators import leaf_spine

    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    sc = parse_scenario(
        'reconvergence = "5us"\n[[events]]\nkind = "link_down"\nat = "10us"\nlink = ["leaf0", "spine0"]\n',
        "sc.toml",
    )
    size = 1_000_000
    bg = [Flow(id=(1 << 50) + i, src=topo.endpoints[i], dst=topo.endpoints[i + 2], size=size) for i in range(2)]
    eng = FaultyFlowSimulator(topo, sc, background=bg)
    eng.submit([Flow(id=0, src=topo.endpoints[1], dst=topo.endpoints[3], size=5000)], at=0)
    assert [c.flow_id for c in eng.drain()] == [0]  # the job sees only its own flow
    reply = decode(NetServer(None, eng, "t", {}, 1 << 20)._serve(decode(encode("get_scenario", 0))))  # type: ignore[arg-type]
    got = reply["scenario"]
    assert [(a["t_ns"], a["op"], a["links"]) for a in got["applied"]] == [
        (10_000, "down", ["leaf0-spine0"]),
        (15_000, "reroute", ["leaf0-spine0"]),
    ]
    assert got["background"] == {"flows": 2, "bytes": 2 * size}
    table = {r["bucket"]: r["flows"] for r in got["fct_slowdown_background"]}
    assert table == {"<10KB": 0, "10KB-100KB": 0, "100KB-1MB": 0, "1MB-10MB": 2, ">=10MB": 0}
    plain = NetServer(None, FlowSimulator(topo), "t", {}, 1 << 20)  # type: ignore[arg-type]
    assert decode(plain._serve(decode(encode("get_scenario", 0))))["scenario"] == {}  # type: ignore[arg-type]
