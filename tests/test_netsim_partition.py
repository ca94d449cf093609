"""`phantora netsim --network ns3 --set partition=N` (issue 38): a flow file or a workload on N worker processes,
the files of one keyed engine; what the workers cannot do yet is refused in one line naming it.

The default tests check the refusals and the defaults without starting a worker; the slow one runs the 8-to-1
cross-leaf incast of docs/packet-model.md on 2 workers and on one keyed engine and compares the files byte for
byte (each worker imports ns-3: about 2 CPU s each).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import KEYED_SCHEDULER
from phantora.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
INCAST = ROOT / "workloads" / "incast8_cross.flows.txt"
KEYED = ["--set", f"scheduler={KEYED_SCHEDULER}"]
NETSIM = ["netsim", "--network", "ns3", "--cc", "dcqcn", "-t", "hpcc/leafspine16", "-q"]
SAME_FILES = ("flows.csv", "fct.txt", "links.csv", "pfc.csv", "pfc.txt", "queues.csv", "drops.csv", "cnps.csv",
              "ecn_marks.csv")  # fmt: skip


def test_partitioned_netsim_samples_no_queues_by_default() -> None:
    """As a decomposed run, the 1 us default is not set (sampling by owner costs one-ns windows until the first flow
    starts, and a sample event a worker); `--queue-sample-ns N` asks for it."""
    sets = [f"scheduler={KEYED_SCHEDULER}", "partition=2"]
    assert packet_config_from_flags(sets=sets).queue_sample_ns == 0
    assert packet_config_from_flags(sets=sets[:1]).queue_sample_ns == 1000
    assert packet_config_from_flags(sets=sets, queue_sample_ns=1000).validate().queue_sample_ns == 1000


def test_decomposition_still_refuses_queue_sampling_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*NETSIM, "-f", str(INCAST), "--set", "workers=2", "--set", "nvlink=fluid", "--set", "nic_latency=1us",
            "--queue-sample-ns", "1000"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "field 'workers'" in err and "queue_sample_ns" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_a_scenario_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "sc.toml"
    sc.write_text('[[events]]\nkind = "link_degrade"\nat = "1us"\nlink = [0, 16]\nrate = "50Gbps"\n')
    assert main([*NETSIM, "-f", str(INCAST), *KEYED, "--set", "partition=2", "--scenario", str(sc)]) == 2
    err = capsys.readouterr().err.strip()
    assert "field '--scenario'" in err and "partition=2" in err and "Traceback" not in err


def test_make_engine_refuses_partition_without_the_bridges_runner() -> None:
    """Without `partitioner` (a caller that does not start the workers) partition=N is refused, not run on one
    engine; replay passes it (tests/test_cut_ray.py)."""
    spec = EngineSpec(network="ns3", packet=packet_config_from_flags(sets=[f"scheduler={KEYED_SCHEDULER}",
                                                                          "partition=2"]))  # fmt: skip
    with pytest.raises(InputError, match="field 'partition'.*phantora netsim"):
        make_engine(spec, load_topology("hpcc/leafspine16"))


@pytest.mark.slow
def test_two_workers_write_one_keyed_engines_files(tmp_path: Path) -> None:
    """The 8-to-1 incast across leaves (7 of 8 flows through one spine, 4,296 CE marks): every file of the run
    byte for byte, and summary.json's figures but the event count (each worker initialises every node) and the
    wall time. Hundreds of its records (CE marks at two switches in one ns) follow one of the same ns from the
    other worker: the keys of their events put them in one engine's order."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*NETSIM, "-f", str(INCAST), *KEYED, "--queue-sample-ns", "0", "--out", str(one)]) == 0
    assert main([*NETSIM, "-f", str(INCAST), *KEYED, "--set", "partition=2", "--out", str(two)]) == 0
    for name in SAME_FILES:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    fct = (one / "fct.txt").read_text().splitlines()
    assert len(fct) == 8 and len((one / "ecn_marks.csv").read_text().splitlines()) > 1000
    a, b = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    part = b.pop("partition")
    assert part["workers"] == 2 and part["windows"] > 1 and part["message_bytes"] > 0
    assert part["ties_by_key"] > 100
    # events: each worker builds the whole fabric and runs every node's setup events, one engine's count of them
    from phantora.netsim.packet import Ns3Simulator

    with Ns3Simulator(load_topology("hpcc/leafspine16"), packet_config_from_flags(cc="dcqcn", sets=KEYED[1:])) as fresh:
        assert part["events_setup"] == fresh.stats()["events"] > 16
    assert b["events"] > a["events"] and "events_setup" in part["events_counted"]
    for s in (a, b):
        del s["events"], s["wall_s"]
    assert a == b
    ea, eb = (json.loads((d / "engine.json").read_text()) for d in (one, two))
    assert ea["spec"]["packet"]["partition"] == 0 and eb["spec"]["packet"]["partition"] == 2
    for e in (ea, eb):  # what the fabric ran by: the same but the partition fields
        for key in ("partition", "partition_worker", "partition_timeout_s"):
            e["spec"]["packet"].pop(key, None)
            e["ns3"]["engine_fields"].pop(key, None)
    assert ea == eb


@pytest.mark.slow
def test_two_workers_sample_queues_as_one_keyed_engine(tmp_path: Path) -> None:
    """The same incast with `--queue-sample-ns 1000`: each worker samples the switches it runs at one engine's
    instants (each sample the last event of its ns), and the merged queues.csv is one keyed engine's byte for byte,
    with every other file."""
    one, two = tmp_path / "one", tmp_path / "two"
    sample = ["--queue-sample-ns", "1000"]
    assert main([*NETSIM, "-f", str(INCAST), *KEYED, *sample, "--out", str(one)]) == 0
    assert main([*NETSIM, "-f", str(INCAST), *KEYED, *sample, "--set", "partition=2", "--out", str(two)]) == 0
    for name in SAME_FILES:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    rows = (one / "queues.csv").read_text().splitlines()[1:]
    assert len(rows) > 100 and len({r.split(",")[1] for r in rows}) > 1  # queues at more than one switch


@pytest.mark.slow
def test_a_worker_joins_sampling_started_in_another(tmp_path: Path) -> None:
    """Flows start 100-700 ns apart, the first in group 0 (hosts 0-7), group 1's own first 200 ns later (under the
    1,000 ns lookahead): the first window runs one ns, group 1 learns the start at its barrier and joins the grid;
    at 2 and 4 workers queues.csv (queues at leaves and the spine of both groups) is one keyed engine's."""
    flows = tmp_path / "join.flows.txt"
    lines = ["0 12 3 100 1000000 2.0", "1 12 3 100 1000000 2.0000001", "8 13 3 100 500000 2.0000002",
             "4 12 3 100 1000000 2.0000003", "5 12 3 100 1000000 2.0000005", "9 12 3 100 500000 2.0000007"]  # fmt: skip
    flows.write_text(f"{len(lines)}\n" + "\n".join(lines) + "\n")
    sample = ["--queue-sample-ns", "1000"]
    one = tmp_path / "one"
    assert main([*NETSIM, "-f", str(flows), *KEYED, *sample, "--out", str(one)]) == 0
    nodes = {r.split(",")[1] for r in (one / "queues.csv").read_text().splitlines()[1:]}
    assert {"leaf16", "leaf19", "spine21"} <= nodes
    for n in (2, 4):
        out = tmp_path / f"p{n}"
        assert main([*NETSIM, "-f", str(flows), *KEYED, *sample, "--set", f"partition={n}", "--out", str(out)]) == 0
        for name in SAME_FILES:
            assert (one / name).read_bytes() == (out / name).read_bytes(), (n, name)


def test_the_records_are_copies_of_the_merged_results_fields() -> None:
    """Each FabricObserver record accessor hands out a copy of its own field of the workers' merged result."""
    from types import SimpleNamespace

    from phantora.netsim.partitioned import PartitionedSimulator

    fields = ("pfc", "queues", "drops", "trims", "cnps", "marks")
    res = SimpleNamespace(completions=[], **{f: [f, i] for i, f in enumerate(fields)})
    topo = load_topology("hpcc/leafspine16")
    sim = PartitionedSimulator(
        topo, packet_config_from_flags(sets=[f"scheduler={KEYED_SCHEDULER}", "partition=2"]), lambda *a: res
    )
    assert sim.fabric() is None and sim.channels() is None  # not run yet
    assert sim.drain() == [] and sim.fabric() is sim and sim.channels() is sim
    got = [sim.pfc_events(), sim.queue_samples(), sim.drops(), sim.trims(), sim.cnp_events(), sim.ecn_mark_events()]
    assert got == [[f, i] for i, f in enumerate(fields)]
    got[0].append("x")
    assert sim.pfc_events() == ["pfc", 0]
    # read through the class, each is the plain accessor (callable with the simulator), documented either way
    names = ("pfc_events", "queue_samples", "drops", "trims", "cnp_events", "ecn_mark_events")
    assert [getattr(PartitionedSimulator, n)(sim) for n in names] == [[f, i] for i, f in enumerate(fields)]
    for name in names:
        doc = getattr(PartitionedSimulator, name).__doc__
        assert doc and doc == getattr(sim, name).__doc__ and doc != type(getattr(sim, name)).__doc__
