"""The packet engine's NIC latency (``--set nic_latency``, `netsim/nic_latency.py`) netted out of NCCL's latency.

NCCL's latency is measured on real NICs: each message on its critical chain already holds the NIC's work-request
latency (doorbell, WQE fetch), as it holds the links' propagation. The collective's first delay therefore nets the
engine's L out once per flow on the idle critical chain that pays it, as it nets the propagation
(`collectives/nccl/shape._delay_ns`), so on an idle network a call takes NCCL's time whatever L is, coarse or
chunked. Where the delay cannot absorb it (L beyond what it holds), the rest shows: the delay stays >= 0. Times
against closed forms: NCCL's model (`Choice`, as dag.choice records it) less the path's propagation."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.errors import InputError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.topology import rail_optimized

MiB = 1 << 20
SEND = Collective("send_recv", (0, 2), MiB, "fp32")  # GPU 0 of host 0 to GPU 0 of host 1, one rail
RING = Collective("all_reduce", (0, 1, 2, 3), MiB, "fp32")


def spec(latency_ns: int, nvlink: str = "packet") -> EngineSpec:
    return EngineSpec("ns3", PacketConfig(cc="dcqcn", nic_latency=latency_ns, nvlink=nvlink))


def first_delay(coll: Collective, granularity: str, engine: EngineSpec) -> int:
    topo = rail_optimized(2, 2, gpu="h100")
    dag = decompose(coll, topo, AlgoOptions(granularity=granularity).on_engine(engine))
    # the first flows' delay: a chunked call's later posted clear-to-sends leave a proxy turn apart after it
    # (back_pressure.posted_ns)
    return min(f.delay_ns for f in dag.flows if not f.deps)


def makespan(coll: Collective, granularity: str, engine: EngineSpec) -> int:
    """The call's end (ns) on `engine`, idle, planned for it."""
    topo = rail_optimized(2, 2, gpu="h100")
    dag = decompose(coll, topo, AlgoOptions(granularity=granularity).on_engine(engine))
    sim = make_engine(engine, topo)
    try:
        sim.submit(dag.flows, at=0)
        return max(c.end_ns for c in sim.drain())
    finally:
        sim.close()


def test_the_engine_spec_tells_the_planner_its_nic_latency() -> None:
    """Only ns3 charges one (the flow engine has none, L = 0); with nvlink=fluid flows inside an NVSwitch skip it."""
    assert AlgoOptions().on_engine(EngineSpec()).nic_latency_ns == 0
    assert AlgoOptions().on_engine(EngineSpec("flow", PacketConfig(nic_latency=1000))).nic_latency_ns == 0
    assert AlgoOptions().on_engine(spec(1000)) == AlgoOptions(nic_latency_ns=1000, nic_on_nvlink=True)
    assert AlgoOptions().on_engine(spec(1000, "fluid")) == AlgoOptions(nic_latency_ns=1000, nic_on_nvlink=False)
    with pytest.raises(InputError, match="nic_latency_ns"):
        AlgoOptions(nic_latency_ns=-1)


def test_a_coarse_send_nets_one_nic_latency() -> None:
    """A coarse send across hosts is one network crossing: NCCL's latency (dag.choice's model_lat_us) less the
    path's propagation and one L, down to 0."""
    topo = rail_optimized(2, 2, gpu="h100")
    dag = decompose(SEND, topo, AlgoOptions(granularity="coarse"))
    (f, *_) = dag.flows
    prop = topo.path_latency_ns(topo.route(f.src, f.dst, f.key, f.via_nic))
    lat = round(float(dag.choice["model_lat_us"]) * 1000)
    for latency in (0, 1000, 20_000, 100_000):
        assert first_delay(SEND, "coarse", spec(latency)) == max(0, lat - prop - latency)


def test_the_flow_engine_plan_is_unchanged() -> None:
    """L = 0: the same flows as without the option."""
    topo = rail_optimized(2, 2, gpu="h100")
    for gran in ("coarse", "chunked"):
        plain = decompose(RING, topo, AlgoOptions(granularity=gran)).flows
        assert decompose(RING, topo, AlgoOptions(granularity=gran).on_engine(EngineSpec())).flows == plain


@pytest.mark.ns3
@pytest.mark.parametrize("coll", [SEND, RING], ids=["send_recv", "all_reduce"])
@pytest.mark.parametrize("granularity", ["coarse", "chunked"])
@pytest.mark.parametrize("nvlink", ["packet", "fluid"])
def test_idle_calls_take_nccls_time_under_nic_latency(ns3_lib, coll: Collective, granularity: str, nvlink: str) -> None:
    """Idle, 1 MiB on 2 hosts of 2 H100: with L = 1 us the call ends when it does with L = 0 (NCCL's time), to 0.01
    us, chunked as coarse, whether ns-3 carries NVLink (every flow pays L) or the fluid side does (only the network
    flows pay it)."""
    base = makespan(coll, granularity, spec(0, nvlink))
    assert makespan(coll, granularity, spec(1000, nvlink)) == pytest.approx(base, abs=10)


@pytest.mark.ns3
@pytest.mark.parametrize(("granularity", "crossings"), [("coarse", 1), ("chunked", 2)])
def test_what_the_delay_cannot_absorb_shows(ns3_lib, granularity: str, crossings: int) -> None:
    """The NIC latency is real: netted only out of what NCCL's latency holds. A 1 MiB send across hosts crosses the
    network once on its idle chain coarse, twice chunked (the CTS of the receive posted at the start, then the
    step it frees; the 4 steps fit the window, so no later CTS waits on the chain). Once crossings x L passes the
    delay at L = 0 (d0: NCCL's latency less the propagation on that chain), the call ends later by crossings x L -
    d0, and by nothing before."""
    base = makespan(SEND, granularity, spec(0))
    d0 = first_delay(SEND, granularity, spec(0))
    for latency in (d0 // crossings - 1000, 50_000, 100_000):
        extra = max(0, crossings * latency - d0)
        assert first_delay(SEND, granularity, spec(latency)) == max(0, d0 - crossings * latency)
        assert makespan(SEND, granularity, spec(latency)) == pytest.approx(base + extra, abs=10)


def test_a_jobs_workload_job_is_planned_for_its_engine(tmp_path: Path) -> None:
    """`--jobs` plans a workload job on the run's engine as `phantora replay` plans the workload alone: a coarse
    all-reduce across the two hosts nets the engine's NIC latency out of its first delay."""
    from phantora.jobs.recorded import plan_recorded
    from phantora.jobs.spec import parse_jobs
    from phantora.replay import plan_workload
    from phantora.workload import load_workload

    (tmp_path / "ar.toml").write_text('[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "1MiB"\nranks = "all"\n')
    job = parse_jobs('[[job]]\nname = "w"\nworkload = "ar.toml"\nranks = 4\n', "jobs.toml", tmp_path).jobs[0]
    topo = rail_optimized(2, 2, gpu="h100")
    gpus = [0, 1, 2, 3]

    def delays(engine: EngineSpec | None) -> set[int]:  # the call's first delay (its flows wait on the op's markers)
        rec = plan_recorded(job, 0, topo, gpus, None, engine=engine)
        return {f.delay_ns for f in rec.flows if f.delay_ns}

    alone = plan_workload(load_workload(tmp_path / "ar.toml", world=4), topo, AlgoOptions().on_engine(spec(1000)))
    assert delays(spec(1000)) == {f.delay_ns for f in alone.flows if f.delay_ns}
    (without,) = delays(None)
    (netted,) = delays(spec(1000))
    assert without - netted == 1000  # one network crossing on the coarse ring's longest path
