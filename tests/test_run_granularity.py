"""`phantora run --granularity chunked`: a live run's collectives as NCCL's steps and chunks, in both engines.

The closed form is the one tests/test_nccl_chunked.py checks the offline decomposition against: a ring
all-reduce's time is NCCL's latency plus bytes over its algorithm bandwidth (a Simple ring across 2 hosts of 2 GPUs
has no extra chain hop, proxy excess nor fill). Fast: the bridge's coordinator driven by scripted ranks
(tests/test_egraph_replay.py's `cosim`), and the launcher handing the option to the bridge. Slow: real live runs
(4 phantom ranks, one 4 MiB all-reduce, NCCL_ALGO=Ring NCCL_PROTO=Simple), recorded, in flow and ns-3 mode: the
closed form, an identical replay (docs/egraph.md: identical step times in flow mode, and in ns-3 with the exact
window), and the granularity in results.json, cosim.json and config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_egraph_replay import cosim

from phantora.cli import main
from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.settings import nccl_env
from phantora.egraph import load, replay_graph
from phantora.egraph.live import record_run
from phantora.errors import InputError
from phantora.launcher import RunConfig, jobs_algo, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "one_all_reduce.py")
TOPO = rail_optimized(2, 2, gpu="h100")  # 4 ranks: NVLink inside a host, a 400G NIC each
SIZE = 4 << 20
ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
COLL = Collective("all_reduce", (0, 1, 2, 3), SIZE, "fp32")


def config(granularity: str, out: Path, network: str = "flow") -> RunConfig:
    return RunConfig(SCRIPT, [str(SIZE)], TOPO, engine=EngineSpec(network=network), out_dir=out, nproc=4,
                     tensors="phantom", trace="none", granularity=granularity, env=dict(ENV),
                     timeout_s=300)  # fmt: skip


def the_all_reduce(report: Any) -> dict[str, Any]:
    (rec,) = [c for c in report.cosim.collectives if c["kind"] == "all_reduce"]
    return rec


def chunked_opts() -> AlgoOptions:
    return AlgoOptions(granularity="chunked", nccl_env=nccl_env(ENV))


def closed_form_us() -> float:
    """NCCL's ring time for COLL: its latency plus bytes over its algorithm bandwidth (no chain, proxy nor fill)."""
    choice = choose(COLL, TOPO, chunked_opts())
    assert choice is not None and (choice.algorithm, choice.protocol) == ("ring", "Simple")
    assert choice.chain_us == 0.0 and choice.proxy_us == 0.0 and choice.fill_us == 0.0
    return choice.lat_us + SIZE / (1000 * choice.algbw)


def test_coordinator_runs_chunked_flows_in_nccls_time_and_replays_them(tmp_path: Path) -> None:
    """The bridge's coordinator with the chunked options: the all-reduce in NCCL's time (0.1%), in NCCL's steps (at
    least 2(n-1) flows where coarse has one per ring edge); its recording replays to the same step end."""
    script = [("x", "all_reduce", COLL.ranks, SIZE, "fp32", None), ("s",)]
    live = cosim(TOPO, [list(script) for _ in COLL.ranks], record=tmp_path / "graph", algo=chunked_opts())
    assert live[0][0] / 1e3 == pytest.approx(closed_form_us(), rel=1e-3)
    graph = load(tmp_path / "graph")
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO))
    assert res.rank_step_ends_ns == live
    coarse = decompose(COLL, TOPO, AlgoOptions(nccl_env=nccl_env(ENV))).flows
    assert res.flows - res.markers >= 2 * (COLL.size - 1) * len(coarse)  # markers: issues and steps


def test_launch_hands_the_granularity_to_the_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunConfig.granularity` is what the bridge decomposes with (its spec's AlgoOptions); coarse by default."""
    import bridge.run

    seen: list[dict[str, Any]] = []

    class StopError(Exception):
        pass

    class Spy(bridge.run.CosimRun):
        def run(self) -> Any:
            seen.append(self.spec.algo)
            raise StopError

    monkeypatch.setattr(bridge.run, "CosimRun", Spy)
    for granularity in ("chunked", None):
        cfg = RunConfig(SCRIPT, topology=TOPO, nproc=4, tensors="phantom")
        if granularity is not None:
            cfg.granularity = granularity
        with pytest.raises(StopError):
            launch(cfg)
    assert [a["granularity"] for a in seen] == ["chunked", "coarse"]


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """The chunked live run, recorded: (report, graph, its output directory)."""
    tmp = tmp_path_factory.mktemp("chunked")
    report, graph = record_run(config("chunked", tmp / "run"), tmp / "graph")
    return report, graph, tmp / "run"


@pytest.mark.slow
def test_live_chunked_ring_all_reduce_takes_nccls_time(chunked: tuple[Any, Any, Path]) -> None:
    """A live run's all-reduce: the closed form (0.1%), in the offline chunked decomposition's flows."""
    report, _, _ = chunked
    rec = the_all_reduce(report)
    assert (rec["end_ns"] - rec["t_start"]) / 1e3 == pytest.approx(closed_form_us(), rel=1e-3)
    assert rec["flows"] == len(decompose(COLL, TOPO, chunked_opts()).flows)


@pytest.mark.slow
def test_replay_of_a_chunked_recording_is_identical(chunked: tuple[Any, Any, Path]) -> None:
    """The recording keeps the granularity (meta.algo); its replay runs the same flows to the same step times."""
    report, graph, _ = chunked
    assert graph.meta["algo"]["granularity"] == "chunked"
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO))
    assert res.flows - res.markers == sum(c["flows"] for c in report.cosim.collectives)  # markers: compute, issues
    assert res.step_times_ns == [s["time_ns"] for s in report.summary["steps"]]


@pytest.mark.slow
def test_results_record_the_granularity(chunked: tuple[Any, Any, Path]) -> None:
    _, _, out = chunked
    assert json.loads((out / "results.json").read_text())["run"]["granularity"] == "chunked"
    assert json.loads((out / "cosim.json").read_text())["granularity"] == "chunked"
    assert json.loads((out / "config.json").read_text())["options"]["granularity"] == "chunked"


def test_bad_granularity_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "-t", "testbed16", "--granularity", "fine", SCRIPT])
    assert "--granularity: invalid choice: 'fine'" in capsys.readouterr().err
    with pytest.raises(InputError, match="granularity must be one of coarse, chunked"):
        launch(RunConfig(SCRIPT, topology=TOPO, granularity="fine"))


@pytest.mark.slow
def test_packet_mode_live_chunked_run_replays_identically(ns3_lib: Any, tmp_path: Path) -> None:
    """ns-3: the live chunked run sends the flow run's flows, in NCCL's time and no sooner (to 3%: packets, headers,
    DCQCN off; a chunked Simple ring's chunk is 2 slice flows since a610b086, each with its own packets and CTS:
    138.03 -> 139.37 us against 135.54, 1.8% -> 2.8%, where the headers alone are 2.3%), and its recording replays
    on ns-3 to the same step times (the exact window)."""
    from phantora.netsim.factory import make_engine

    report, graph = record_run(config("chunked", tmp_path / "run", "ns3"), tmp_path / "graph")
    rec = the_all_reduce(report)
    assert rec["flows"] == len(decompose(COLL, TOPO, chunked_opts()).flows)
    assert closed_form_us() <= (rec["end_ns"] - rec["t_start"]) / 1e3 <= closed_form_us() * 1.03
    sim = make_engine(EngineSpec(network="ns3"), TOPO)
    try:
        res = replay_graph(graph, TOPO, sim)
    finally:
        sim.close()
    assert res.step_times_ns == [s["time_ns"] for s in report.summary["steps"]]


def test_several_jobs_take_the_runs_granularity() -> None:
    """`phantora run --jobs`: the run's granularity (or model) off its default is every job's; else None, and a
    recorded graph keeps the options it was recorded with."""
    assert jobs_algo(RunConfig(SCRIPT)) is None
    algo = jobs_algo(RunConfig(SCRIPT, granularity="chunked"))
    assert algo is not None and (algo.granularity, algo.model) == ("chunked", "nccl")
    algo = jobs_algo(RunConfig(SCRIPT, collective_model="ideal"))
    assert algo is not None and (algo.granularity, algo.model) == ("coarse", "ideal")
