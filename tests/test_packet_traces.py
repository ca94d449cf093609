"""`phantora netsim` on workload files, and the CNP / ECN-mark / queue traces of the packet engine."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.commands.netsim import detect_flows_format, read_netsim_input
from phantora.netsim.cli_config import QUEUE_SAMPLE_NS
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.paths import REPO_ROOT
from phantora.replay import replay_inprocess
from phantora.topology import load_topology
from phantora.workload import load_workload, workload_to_dict

INCAST_HEAVY = REPO_ROOT / "workloads" / "incast_heavy.toml"
# A 4-to-1 incast into one 100G port of star8, twice per sender: DCQCN gets ECN marks, hence CNPs.
SMALL_INCAST = """\
name = "incast4"
[defaults]
kind = "send_recv"
bytes = "512KiB"
dst = 0
repeat = 2
[[op]]
src = 1
[[op]]
src = 2
[[op]]
src = 3
[[op]]
src = 4
"""
HPCC_FLOWS = "2\n1 0 3 100 100000 0\n2 0 3 100 100000 0.000001\n"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_flow_file_format_is_told_by_suffix_then_content(tmp_path: Path) -> None:
    hpcc = tmp_path / "flows.txt"
    hpcc.write_text("# a comment\n" + HPCC_FLOWS)
    toml_no_suffix = tmp_path / "incast.wl"
    toml_no_suffix.write_text(SMALL_INCAST)
    json_no_suffix = tmp_path / "incast.flows"
    json_no_suffix.write_text(json.dumps({"op": [{"kind": "send_recv", "src": 1, "dst": 0, "bytes": 1000}]}))
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello world\n")
    assert detect_flows_format(hpcc) == "hpcc"
    assert detect_flows_format(INCAST_HEAVY) == "workload"
    assert detect_flows_format(toml_no_suffix) == "workload"
    assert detect_flows_format(json_no_suffix) == "workload"
    assert detect_flows_format(garbage) == "hpcc"  # so the HPCC reader's error explains it

    topo = load_topology("star8")
    inp = read_netsim_input(hpcc, topo)
    assert inp.fmt == "hpcc" and [b[0] for b in inp.batches] == [0, 1000] and not inp.hidden
    inp = read_netsim_input(toml_no_suffix, topo)
    assert inp.fmt == "workload" and inp.ops == 8 and len(inp.reported) == 8
    assert all(f.size == 0 and f.src == f.dst for f in inp.flows if f.id in inp.hidden)


def test_cli_netsim_bad_workload_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[op]]\nkind = "send_recv"\nsrc = 1\ndst = 0\nbytes = "1MiB"\nspeed = 3\n')
    assert main(["netsim", "-t", "star8", "-f", str(bad), "--network", "flow"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: field 'speed'" in err and "Traceback" not in err
    far = tmp_path / "far.toml"
    far.write_text('[[op]]\nkind = "send_recv"\nsrc = 1\ndst = 99\nbytes = "1MiB"\n')
    assert main(["netsim", "-t", "star8", "-f", str(far), "--network", "flow"]) == 2
    assert "outside the topology" in capsys.readouterr().err
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello world\n")
    assert main(["netsim", "-t", "star8", "-f", str(garbage), "--network", "flow"]) == 2
    assert "line 1 must be the flow count" in capsys.readouterr().err


def test_cli_netsim_runs_a_workload_on_the_flow_engine_like_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "toml"
    assert main(["netsim", "-t", "star8", "-f", str(INCAST_HEAVY), "--network", "flow", "-o", str(out)]) == 0
    assert "21 flows on star8 (flow" in capsys.readouterr().out
    fct = rows(out / "flows.csv")
    assert len(fct) == 21 and {r["tag"].split("/")[0] for r in fct} == {
        f"from{s}.{i}" for s in range(1, 8) for i in range(3)
    }
    assert all(r["cnps"] == "" and r["ecn_marks"] == "" for r in fct)  # not measured by the flow engine
    assert len((out / "fct.txt").read_text().splitlines()) == 21
    for name in ("pfc.csv", "pfc.txt", "queues.csv", "drops.csv", "cnps.csv", "ecn_marks.csv"):
        assert not (out / name).exists()  # the flow engine does not measure them: absent, not empty
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input_format"] == "workload" and summary["flows"] == 21 and summary["ops"] == 21

    # The same DAG as `phantora replay`: identical completion times.
    topo = load_topology("star8")
    wl = load_workload(INCAST_HEAVY, world=topo.num_ranks)
    sim = FlowSimulator(topo, payload_efficiency=1000 / 1048)
    try:
        ref = {c.flow_id: c.end_ns for c in replay_inprocess(wl, topo, sim).completions}
    finally:
        sim.close()
    assert {int(r["flow_id"]): int(r["end_ns"]) for r in fct} == ref
    assert summary["sim_end_ns"] == max(ref.values())

    # JSON, told by its content (no suffix): the same answers.
    js = tmp_path / "incast_heavy.wl"
    js.write_text(json.dumps(workload_to_dict(wl)))
    out2 = tmp_path / "json"
    assert main(["netsim", "-t", "star8", "-f", str(js), "--network", "flow", "-o", str(out2)]) == 0
    assert [r["end_ns"] for r in rows(out2 / "flows.csv")] == [r["end_ns"] for r in fct]


@pytest.mark.ns3
def test_cli_netsim_workload_with_dcqcn_traces_cnps_ecn_marks_and_queues(
    ns3_lib, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wl = tmp_path / "incast4.toml"
    wl.write_text(SMALL_INCAST)
    out = tmp_path / "out"
    assert main(["netsim", "--network", "ns3", "--cc", "dcqcn", "-t", "star8", "-f", str(wl), "-o", str(out)]) == 0
    assert "8 flows on star8 (ns3, cc dcqcn)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    fct = rows(out / "flows.csv")
    assert len(fct) == 8 and summary["flows"] == 8 and summary["marker_flows"] > 0
    assert summary["payload_bytes_delivered"] == 8 * 512 * 1024 and summary["drops"] == 0

    cnps = rows(out / "cnps.csv")
    assert summary["cnps"] > 0 and len(cnps) == summary["cnps"]
    assert all(r["from_node_id"] == "0" and r["node_id"] in {"1", "2", "3", "4"} for r in cnps)
    assert {(r["from_node"], r["node"]) for r in cnps} <= {("host0", f"host{i}") for i in (1, 2, 3, 4)}
    times = [int(r["time_ns"]) for r in cnps]
    assert times == sorted(times)
    per_flow = Counter(r["flow_id"] for r in cnps)
    assert {r["flow_id"]: int(r["cnps"]) for r in fct if int(r["cnps"])} == dict(per_flow)

    marks = rows(out / "ecn_marks.csv")
    links = rows(out / "links.csv")
    assert summary["ecn_marks"] > 0 and len(marks) == summary["ecn_marks"]
    assert len(marks) == sum(int(r["ecn_marks"]) for r in links)
    by_channel = Counter(r["channel"] for r in marks)
    assert by_channel == {r["channel"]: int(r["ecn_marks"]) for r in links if int(r["ecn_marks"])}
    assert sum(int(r["ecn_marks"]) for r in fct) == len(marks)
    # Every mark on this path (one switch, ack every packet) comes back as exactly one CNP.
    assert len(cnps) == len(marks)

    # Queue sampling is on by default on the command line (not in the engine API).
    assert PacketConfig().queue_sample_ns == 0 and QUEUE_SAMPLE_NS > 0
    queues = rows(out / "queues.csv")
    assert queues and max(int(r["bytes"]) for r in queues) > 400_000  # past DCQCN's 400 KB kmin at 100G
    assert {(r["node_id"], r["port"], r["prio"]) for r in queues} >= {("8", "0", "3")}  # switch 8 -> rank 0
    # named as the topology names them: port 0 of switch8 is its link to host0
    assert {(r["node"], r["peer"]) for r in queues if r["node_id"] == "8" and r["port"] == "0"} == {
        ("switch8", "host0")
    }


@pytest.mark.ns3
def test_cnp_and_ecn_traces_can_be_switched_off(ns3_lib, tmp_path: Path) -> None:
    from phantora.netsim.packet import Ns3Simulator

    topo = load_topology("star8")
    inp = read_netsim_input(INCAST_HEAVY, topo)
    flows = inp.flows[: len(inp.flows) // 3]  # the first message of each sender (and its markers)
    ids = {f.id for f in flows}
    flows = [f for f in flows if set(f.deps) <= ids]
    cfg = PacketConfig(cc="dcqcn", trace_cnp=False, trace_ecn=False)
    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(flows, at=0)
        sim.drain()
        sim.finish()
        st = sim.stats()
        assert st["cnps"] > 0 and st["ecn_marks"] > 0
        assert sim.cnp_events() == [] and sim.ecn_mark_events() == []
