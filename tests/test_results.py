"""The run directory has one owner: its schema, its writers and its reader (phantora.results).

Also the engine interface its producers rely on (phantora.netsim.base, .observe) and the one standalone-FCT
function, checked against its closed forms.
"""

from __future__ import annotations

import csv
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.remote import RemoteSimulator
from phantora.errors import InputError
from phantora.netsim.base import Completion, NetworkSimulator
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.observe import FabricObserver
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.standalone import standalone_fct_ns
from phantora.results import schema as S
from phantora.results.read import load_run
from phantora.results.write import write_csv, write_flows_csv, write_json
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parents[1]


def test_csv_headers_and_schema_ids_are_written_only_in_the_schema() -> None:
    """No producer spells a column list or a schema id of its own."""
    literals = [
        '"flow_id", "tag"',
        '"flow_id", "src", "dst"',
        '"time_ns", "node", "node_type"',
        '"channel", "link", "from"',
        '"channel", "src", "dst"',
        '"schema": "phantora.run/',
        '"schema": "phantora.replay/',
        '"schema": "phantora.egraph-replay/',
        '"schema": "phantora.netsim/',
        '"schema": "phantora.cosim/',
    ]
    offenders = []
    for path in [*sorted((ROOT / "phantora").rglob("*.py")), *sorted((ROOT / "bridge").rglob("*.py"))]:
        if path == ROOT / "phantora" / "results" / "schema.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {lit}" for lit in literals if lit in text]
    assert offenders == []


def test_writes_are_atomic_and_leave_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "results.json"
    write_json(path, {"schema": S.RUN, "step_time_ns": 7})
    write_json(path, {"schema": S.RUN, "step_time_ns": 9})  # a re-run replaces the file whole
    assert json.loads(path.read_text()) == {"schema": S.RUN, "step_time_ns": 9}
    write_csv(tmp_path / "run" / "t.csv", ("a", "b"), [(1, 2)])
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json", "t.csv"]


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path: Path) -> None:
    """A CSV whose rows fail part-way (a generator that raises: queues.csv streams its rows) leaves the file before
    it whole and no temporary file beside it."""
    path = write_csv(tmp_path / "t.csv", ("a",), [(1,)])

    def rows() -> Iterator[tuple[int]]:
        yield (2,)
        raise RuntimeError("cut")

    with pytest.raises(RuntimeError, match="cut"):
        write_csv(path, ("a",), rows())
    assert path.read_bytes() == b"a\r\n1\r\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_the_reader_dispatches_on_the_schema_id(tmp_path: Path) -> None:
    run = tmp_path / "a"
    write_json(run / S.SUMMARY_JSON, {"schema": S.NETSIM, "engine": "ns3", "sim_end_ns": 1234})
    data = load_run(run)
    assert (data.kind, data.network, data.time_ns) == ("netsim", "ns3", 1234)
    write_json(run / S.RESULTS_JSON, {"schema": "phantora.someday/9"})
    with pytest.raises(InputError, match="unknown schema") as err:
        load_run(run)
    assert "results.json" in str(err.value)


def test_flows_csv_has_the_schema_columns_and_the_fluid_standalone_fct(tmp_path: Path) -> None:
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    a, b = [n.id for n in topo.nodes if n.kind in ("gpu", "host")][:3:2]  # hosts under different leaves
    done = [Completion(7, 0, 50_000, 125_000, a, b, "x"), Completion(8, 0, 10, 0, a, b, "marker")]
    write_flows_csv(tmp_path / S.FLOWS_CSV, topo, done)
    header = (tmp_path / S.FLOWS_CSV).read_text().splitlines()[0]
    assert tuple(header.split(",")) == S.FLOWS_COLUMNS
    rows = list(csv.DictReader((tmp_path / S.FLOWS_CSV).open()))
    assert len(rows) == 1  # the empty marker flow is not a flow of the network
    hops = len(topo.route(a, b, 7))
    assert hops == 4  # host -> leaf -> spine -> leaf -> host
    alone = 125_000 * 8 * 10**9 // 100_000_000_000 + hops * 1000  # 10 us + 4 us
    row = rows[0]
    assert int(row["standalone_fct_ns"]) == alone and int(row["fct_ns"]) == 50_000
    assert float(row["slowdown"]) == pytest.approx(50_000 / alone, abs=1e-4)
    # nodes by name, ids kept; what the engine did not measure is empty, not 0
    assert (row["src"], row["dst"], row["src_id"], row["dst_id"]) == (
        topo.nodes[a].name,
        topo.nodes[b].name,
        str(a),
        str(b),
    )
    assert row["cnps"] == row["ecn_marks"] == row["priority"] == ""


def test_packet_standalone_fct_is_hpccs_closed_form() -> None:
    """2 x propagation + one payload's serialisation per hop + every byte with headers at the bottleneck."""
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    a, b = [n.id for n in topo.nodes if n.kind in ("gpu", "host")][:3:2]
    size, payload, header = 10_000, 1000, 48
    rates = [topo.channel_bandwidth(c) for c in topo.route(a, b, 0)]
    assert rates == [100 * 10**9, 200 * 10**9, 200 * 10**9, 100 * 10**9]  # 2 hosts per leaf, 1:1: 200G uplinks
    serialise_ps = 2 * 80_000 + 2 * 40_000  # 1000 bytes at 100G, then at 200G
    expected = 2 * 4 * 1000 + serialise_ps // 1000 + (size + 10 * header) * 8 * 10**9 // (100 * 10**9)
    assert standalone_fct_ns(topo, a, b, size, 0, (payload, header)) == expected
    assert standalone_fct_ns(topo, a, a, size, 0) == 0 and standalone_fct_ns(topo, a, b, 0, 0) == 0


@pytest.mark.parametrize("engine", [FlowSimulator, Ns3Simulator, RemoteSimulator])
def test_every_engine_implements_the_whole_declared_interface(engine: type) -> None:
    declared = {n for n, v in vars(NetworkSimulator).items() if callable(v) and not n.startswith("_")}
    assert {"advance_watching", "keepalive", "channels", "fabric"} <= declared
    missing = sorted(n for n in declared if not callable(getattr(engine, n, None)))
    assert missing == []
    for name in declared:  # the declared parameters first, in order; any extra one has a default
        want = list(inspect.signature(getattr(NetworkSimulator, name)).parameters)
        got = inspect.signature(getattr(engine, name)).parameters
        assert list(got)[: len(want)] == want, f"{engine.__name__}.{name}"
        assert all(p.default is not p.empty for p in list(got.values())[len(want) :]), f"{engine.__name__}.{name}"


def test_observers_are_declared_not_probed() -> None:
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    flow = FlowSimulator(topo)
    assert flow.fabric() is None and flow.channels() is flow
    fabric_methods = {n for n, v in vars(FabricObserver).items() if callable(v) and not n.startswith("_")}
    assert fabric_methods <= {n for n in dir(Ns3Simulator) if not n.startswith("_")}
    sources = [*(ROOT / "phantora").rglob("*.py"), *(ROOT / "bridge").rglob("*.py")]
    probes = [str(p.relative_to(ROOT)) for p in sources if re.search(r"hasattr\((engine|sim|eng)\b", p.read_text())]
    assert probes == []
