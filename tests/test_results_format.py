"""One results format: `run`, `replay` (workloads and recorded graphs) and `netsim` write the same network files,
with the same columns, nodes named as the topology names them and their ids kept in *_id columns."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from test_egraph_replay import MiB, cosim, ddp_script, star

from phantora.cli import main
from phantora.results import schema as S
from phantora.topology import load_topology

NETWORK_FILES = {
    S.FLOWS_CSV: S.FLOWS_COLUMNS,
    S.LINKS_CSV: S.LINK_COLUMNS,
    S.PFC_CSV: S.PFC_COLUMNS,
    S.QUEUES_CSV: S.QUEUE_COLUMNS,
    S.DROPS_CSV: S.DROP_COLUMNS,
    S.CNPS_CSV: S.CNP_COLUMNS,
    S.ECN_CSV: S.ECN_COLUMNS,
}
INCAST = 'name = "incast4"\n[defaults]\nkind = "send_recv"\nbytes = "512KiB"\ndst = 0\n' + "".join(
    f"[[op]]\nsrc = {s}\n" for s in (1, 2, 3, 4)
)


# 2 steps x 2 buckets of 8 MiB, ring all-reduce on 8 ranks (ideal model): each rank sends 2 (n - 1) / n of a bucket
# each time
RING_SENT = 2 * 2 * 2 * 7 * (8 * MiB // 8)


def ring_bytes_sent(flows: list[dict[str, str]]) -> Counter[str]:
    sent: Counter[str] = Counter()
    for f in flows:
        sent[f["src"]] += int(f["size_bytes"])
    return sent


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def header(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text().splitlines()[0].split(","))


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded execution graph: 8 ranks, 2 steps of DDP with two 8 MiB bucket all-reduces."""
    path = tmp_path_factory.mktemp("graph") / "trace"
    cosim(star(8), [ddp_script(r, 8, 2, 8 * MiB, 500_000) for r in range(8)], record=path)
    return path


def check_names(out: Path, topo_name: str) -> None:
    """Every node column holds the name of the node its *_id column numbers; a queue's peer is the node at
    the other end of that port (ports numbered as the node's links attach)."""
    topo = load_topology(topo_name)
    name = {n.id: n.name for n in topo.nodes}
    pairs = {S.FLOWS_CSV: (("src", "src_id"), ("dst", "dst_id")), S.LINKS_CSV: (("from", "from_id"), ("to", "to_id"))}
    pairs |= {f: (("node", "node_id"),) for f in (S.PFC_CSV, S.QUEUES_CSV, S.DROPS_CSV, S.ECN_CSV)}
    pairs |= {S.CNPS_CSV: (("node", "node_id"), ("from_node", "from_node_id"))}
    for file, cols in pairs.items():
        if not (out / file).exists():
            continue
        for row in rows(out / file):
            for named, ids in cols:
                assert row[named] == name[int(row[ids])], (file, row)
    for row in rows(out / S.QUEUES_CSV) if (out / S.QUEUES_CSV).exists() else []:
        peer = topo.neighbours(int(row["node_id"]))[int(row["port"])][0]
        assert row["peer"] == name[peer]


@pytest.mark.ns3
def test_a_replayed_graph_writes_every_network_file_as_netsim_does(ns3_lib, trace: Path, tmp_path: Path) -> None:
    graph, flows = tmp_path / "graph", tmp_path / "netsim"
    wl = tmp_path / "incast4.toml"
    wl.write_text(INCAST)
    ideal = ["--collective-model", "ideal"]  # RING_SENT is the ideal model's payload (no protocol wire bytes)
    assert (
        main(["replay", str(trace), "-t", "star8", "--network", "ns3", "--cc", "dcqcn", *ideal, "-o", str(graph)]) == 0
    )
    assert main(["netsim", "--network", "ns3", "-t", "star8", "-f", str(wl), "--cc", "dcqcn", "-o", str(flows)]) == 0
    for file, columns in NETWORK_FILES.items():
        assert header(graph / file) == header(flows / file) == columns, file
    for out in (graph, flows):
        check_names(out, "star8")
    # the replay keeps every flow of the 4 all-reduces and samples queues by default
    assert ring_bytes_sent(rows(graph / S.FLOWS_CSV)) == {f"host{i}": RING_SENT for i in range(8)}
    assert rows(graph / S.QUEUES_CSV) and rows(flows / S.QUEUES_CSV)
    # each flow's CE marks in flows.csv are the rows of ecn_marks.csv of that flow
    marks = Counter(r["flow_id"] for r in rows(flows / S.ECN_CSV))
    assert (
        marks
        and {r["flow_id"]: int(r["ecn_marks"]) for r in rows(flows / S.FLOWS_CSV) if r["ecn_marks"] != "0"} == marks
    )
    # --queue-sample-ns 0: the same option on every command turns sampling off
    off = tmp_path / "off"
    assert (
        main(["replay", str(trace), "-t", "star8", "--network", "ns3", "--queue-sample-ns", "0", "-o", str(off)]) == 0
    )
    assert rows(off / S.QUEUES_CSV) == []


def test_a_replayed_graph_on_the_flow_network_writes_flows_and_links(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "flow"
    # RING_SENT is the ideal model's payload (no protocol wire bytes)
    assert main(["replay", str(trace), "-t", "star8", "--collective-model", "ideal", "-o", str(out)]) == 0
    assert header(out / S.FLOWS_CSV) == S.FLOWS_COLUMNS and header(out / S.LINKS_CSV) == S.LINK_COLUMNS
    for file in (S.PFC_CSV, S.QUEUES_CSV, S.DROPS_CSV, S.CNPS_CSV, S.ECN_CSV):
        assert not (out / file).exists()  # the flow engine does not measure them: absent means not measured
    check_names(out, "star8")
    flows, links = rows(out / S.FLOWS_CSV), rows(out / S.LINKS_CSV)
    # star8: host i -> switch8 carries exactly the flows host i sends, switch8 -> host i those it receives
    sent, got = Counter(), Counter()
    for f in flows:
        sent[f["src"]] += int(f["size_bytes"])
        got[f["dst"]] += int(f["size_bytes"])
    assert {r["from"]: int(r["bytes"]) for r in links if r["to"] == "switch8"} == sent
    assert {r["to"]: int(r["bytes"]) for r in links if r["from"] == "switch8"} == got
    assert sent == ring_bytes_sent(flows) == {f"host{i}": RING_SENT for i in range(8)}


def test_topo_json_maps_ids_to_names(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["topo", "testbed16", "--json", "--no-bisection"]) == 0
    table = json.loads(capsys.readouterr().out)["node_table"]
    topo = load_topology("testbed16")
    assert [(n["id"], n["name"], n["kind"]) for n in table] == [(n.id, n.name, n.kind) for n in topo.nodes]
    assert [n["id"] for n in table if n["rank"] is not None] == topo.endpoints
