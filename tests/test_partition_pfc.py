"""PFC pauses across a cut cable on stepped partition workers (issue 38, item 1: "the same completions, PFC, queues
and traces as one engine").

Slow (each worker imports ns-3): a workload (an all-to-all, then a ring all-reduce) on testbed16 with 400 KB switch
buffers, so that leaves and spines of different groups pause each other (PFC frames over the cut cables), replayed
with the documented fast settings (``nvlink=fluid``, ``wire=roce4k``, keyed) on one engine and on 2 stepped
partition workers: every output file byte for byte, under DCQCN and under HPCC with the HPCC models' ECMP hash.
The run ends at a fabric flow's completion, with its last ACKs still on the way back; one engine's drain stops at
that ns, and until the stepped driver bounded its last rounds by the unfinished flows' bounds
(`SteppedPartition._last_end`) the workers ran on to the last ACK, and links.csv's counters had those ACKs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.netsim.partition import adopted, partition_fabric
from phantora.topology.loader import load_topology

FILES = ("flows.csv", "links.csv", "pfc.csv", "ecn_marks.csv", "cnps.csv", "drops.csv", "queues.csv")


def workload(path: Path) -> Path:
    path.write_text(
        'name = "a2a-ar"\n[defaults]\nranks = "all"\ndtype = "bf16"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "256KiB"\n'
        '[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "4MiB"\nafter = ["a2a"]\ngap = "1us"\n'
    )
    return path


def replay(wl: Any, topo: Any, config: PacketConfig, out: Path, **engine: Any) -> dict[str, object]:
    """Replay `wl` in process on one engine (partition 0) or on the workers `config` names; write its files to `out`
    and return the engine's stats."""
    from bridge.cut_pool import run_partitioned_batches
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.replay import replay_inprocess
    from phantora.report.replay_report import write_replay_outputs

    spec = EngineSpec("ns3", config)
    sim = make_engine(spec, topo, partitioner=run_partitioned_batches, **engine)
    try:
        res = replay_inprocess(wl, topo, sim)
        write_replay_outputs(out, res, workload=wl.name, topology=topo, network="ns3", engine=sim, spec=spec)
        return dict(sim.stats())
    finally:
        sim.close()


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize("cc", ["dcqcn", "hpcc"])
def test_pauses_across_the_cut_write_one_keyed_engines_files(cc: str, tmp_path: Path) -> None:
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.workload import load_workload

    topo = load_topology("testbed16")
    wl = load_workload(workload(tmp_path / "wl.toml"), world=topo.num_ranks)
    sets = ["nvlink=fluid", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=400000", "queue_sample_ns=0"]
    cfg = apply_overrides(PacketConfig(cc=cc), [*sets, *(["ecmp_hash=hpcc"] if cc == "hpcc" else [])])

    one = replay(wl, topo, cfg, tmp_path / "one", stepper=spawn_stepped)
    two = replay(wl, topo, dataclasses.replace(cfg, partition=2), tmp_path / "two", stepper=spawn_stepped)
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    counters = ("flows_submitted", "flows_completed", "data_packets", "acks", "pfc_pause", "pfc_resume")
    assert {k: two[k] for k in counters} == {k: one[k] for k in counters}
    assert two["partition"]["workers"] == 2  # type: ignore[index]
    # pauses crossed the cut: a switch of one group paused by a switch of the other
    groups = adopted(topo, partition_fabric(topo, 2).groups)
    rows = [r.split(",") for r in (tmp_path / "one" / "pfc.csv").read_text().splitlines()[1:]]
    crossing = [r for r in rows if r[6] == "1" and groups[int(r[2])] != groups[int(r[8])]]
    switches = {v for v, node in enumerate(topo.nodes) if node.kind == "switch"}
    assert len(rows) > 1000 and len(crossing) > 100
    assert all(int(r[2]) in switches and int(r[8]) in switches for r in crossing)
    # the run ends on a fabric flow's completion (the case the workers used to run past)
    flows = [r.split(",") for r in (tmp_path / "one" / "flows.csv").read_text().splitlines()[1:]]
    last = max(flows, key=lambda r: int(r[9]))
    assert topo.nodes[int(last[4])].kind == "gpu" and groups[int(last[4])] != groups[int(last[5])]


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize("cc", ["dcqcn", "hpcc"])
def test_whole_dag_replay_stops_at_the_last_completion(cc: str, tmp_path: Path) -> None:
    """The whole-DAG path (packet NVLink: the workers run the DAG without a driver) on testbed16 with 400 KB buffers,
    2 workers: one engine's replay drains to its last completion's event, the last ACKs still on their way; the
    workers ran on to the last ACK (links.csv counted those ACKs) until the window exchange carried the flows left
    in flight and their greatest bound (`cut_windows.run_windows`' ``finish``): now they run that ns in lockstep
    rounds and stop right after that event. Every file byte for byte (under HPCC with its hash, an ACK of that ns
    after the completion's event counted on one channel when the workers ran the ns whole)."""
    from phantora.workload import load_workload

    topo = load_topology("testbed16")
    wl = load_workload(workload(tmp_path / "wl.toml"), world=topo.num_ranks)
    sets = ["wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=400000", "queue_sample_ns=0"]
    cfg = apply_overrides(PacketConfig(cc=cc), [*sets, *(["ecmp_hash=hpcc"] if cc == "hpcc" else [])])

    one = replay(wl, topo, cfg, tmp_path / "one")
    two = replay(wl, topo, dataclasses.replace(cfg, partition=2), tmp_path / "two")
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    part = two["partition"]
    assert part["workers"] == 2 and "stepped" not in part  # type: ignore[index,operator]
    assert part["windows_ended_by"].get("last completion", 0) > 0  # type: ignore[index]
    assert {k: two[k] for k in ("flows_completed", "data_packets", "acks")} == {
        k: one[k] for k in ("flows_completed", "data_packets", "acks")
    }
