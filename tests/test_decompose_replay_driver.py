"""Which driver `--set workers=N` builds (`factory.make_engine`, issue 38 item 2): the plain `DecomposedSimulator` in
every mode by default; route (a)'s `HybridDecomposedSimulator` for a whole-DAG replay when `WHOLE_DAG_DRIVER` asks
(not the default: slower on the users' replay, docs/packet-model.md). Both give one engine's files byte for byte."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bridge.workers import spawn_workers
from phantora.cli import main
from phantora.netsim import factory
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.replay import replay_inprocess
from phantora.topology.loader import load_topology
from phantora.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "rail_allreduce.toml"  # README's workers=2 line: 2 rail all-reduces of 8 MiB
SETTINGS = ["--set", "nvlink=fluid", "--set", "wire=roce4k", "--set", "nic_latency=1us"]
FILES = ("flows.csv", "pfc.csv", "drops.csv", "cnps.csv", "ecn_marks.csv", "links.csv")


def completions(whole_dag: bool, workers: int) -> tuple[list[tuple[int, int, int]], str]:
    """Every flow's (id, start, end) from a replay of WORKLOAD on rail128, and the engine's class name."""
    topo = load_topology("rail128")
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    config = replace(config, workers=workers)
    sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers, whole_dag=whole_dag)
    try:
        res = replay_inprocess(load_workload(WORKLOAD, world=topo.num_ranks), topo, sim)
        return sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions), type(sim).__name__
    finally:
        sim.close()


@pytest.mark.slow  # three replays, two of them starting 2 workers that load ns-3 (about 20 CPU s)
def test_a_replay_on_either_driver_equals_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    one, _ = completions(False, 0)
    plain, plain_cls = completions(True, 2)  # the default for a whole-DAG replay
    monkeypatch.setattr(factory, "WHOLE_DAG_DRIVER", "hybrid")
    hybrid, hybrid_cls = completions(True, 2)
    assert plain_cls == "FluidNvlinkSimulator" and hybrid_cls == HybridDecomposedSimulator.__name__
    assert len(one) > 600  # (not vacuous: the two all-reduces' fabric and NVLink flows)
    assert hybrid == one and plain == one


@pytest.mark.slow  # two CLI replays, one of them on 2 workers (about 15 CPU s)
@pytest.mark.parametrize("reuse", ["off", "on"])
def test_replay_with_hybrid_workers_writes_one_engines_files(
    tmp_path: Path, reuse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`phantora replay --set workers=2` on route (a)'s driver writes one engine's files byte for byte, with and
    without profile reuse (each worker keeps its own episodes: exact on this workload, as on one engine)."""
    monkeypatch.setattr(factory, "WHOLE_DAG_DRIVER", "hybrid")
    args = ["replay", str(WORKLOAD), "--topology", "rail128", "--network", "ns3", "--cc", "dcqcn", *SETTINGS]
    args += ["--set", f"reuse={reuse}"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert main([*args, "--set", "workers=2", "--out", str(tmp_path / "two")]) == 0
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert (tmp_path / "one" / "flows.csv").read_text().count("\n") > 600
