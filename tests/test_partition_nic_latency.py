"""A NIC latency on stepped partition workers (issue 38, item 1: `partition=N` with ``nvlink=fluid`` and
``nic_latency``; refused before by `partition_stepped`'s `_check_config`).

One engine runs `NicLatencySimulator` over ns-3: it holds each fabric flow until the ns before its first packet
(posted + L) and hands it to ns-3 then, without deps. The stepped driver stacks the same over its workers
(`factory.partitioned`), which stop where it may hand a flow over (`SteppedPartition.follow`). Slow (each worker
imports ns-3): an all-to-all, then a ring all-reduce, on testbed16 with 400 KB buffers (PFC across the cut), one
keyed engine against 2 stepped workers: every output file byte for byte, with queue samples, at L = 1 us and at
L = 1 ns (a flow handed over at its post ns); and with profile reuse (``reuse=on``: `NicLatencySimulator` over reuse
over the stepped driver, as over one engine's ns-3), refused until 2026-12-02.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from tests.test_partition_pfc import FILES, replay, workload


def test_nic_latency_with_reuse_is_taken_by_the_stepped_driver() -> None:
    """Not refused (until 2026-12-02 `_check_config` did, before any worker started): the driver starts its pool."""
    from phantora.netsim.partition_stepped import SteppedPartition
    from tests.test_partition_reuse import _FakePool

    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", nic_latency=1000, reuse="on",
                       partition=2)  # fmt: skip
    started: list[object] = []

    def spawn(*args: object) -> _FakePool:
        started.append(args)
        return _FakePool()

    sim = SteppedPartition(load_topology("testbed16"), cfg, spawn)  # type: ignore[arg-type]
    assert started and sim.config.nic_latency == 1000 and sim.config.reuse == "on"


@pytest.mark.slow  # one engine twice, 2 workers (each imports ns-3): about 25 s wall at load 25
@pytest.mark.ns3
def test_nic_latency_with_reuse_on_stepped_workers_writes_one_keyed_engines_files(tmp_path: Path) -> None:
    """tests/test_partition_reuse.py's periodic incasts (reuse exact there: step marking, a queue pair per flow) with
    a 1 us NIC latency: reuse over 2 stepped workers decides as one engine's (6 episodes, 4 served, 1 materialised)
    and every file is byte for byte one keyed engine's with reuse, whose completions are those without it."""
    from tests.test_partition_reuse import FILES as REUSE_FILES
    from tests.test_partition_reuse import periodic_incasts, run

    topo = load_topology("testbed16")
    flows = periodic_incasts(topo)
    want, _ = run(topo, flows, None, nic_latency=1000)
    one, on = run(topo, flows, tmp_path / "one", reuse="on", nic_latency=1000)
    assert one == want and len(want) == len(flows)
    two, stats = run(topo, flows, tmp_path / "two", reuse="on", nic_latency=1000, partition=2)
    assert two == want
    keys = ("episodes", "recorded", "served", "materialised", "flows_served", "mismatches")
    episodes = {k: stats[f"reuse_{k}"] for k in keys}
    assert episodes == {k: on[f"reuse_{k}"] for k in keys}
    assert episodes["served"] == 4 and episodes["materialised"] == 1 and episodes["mismatches"] == 0
    assert stats["partition"]["workers"] == 2 and stats["decompose"]["nic_latency_ns"] == 1000
    for name in REUSE_FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    # the latency is in every fabric FCT (served ones too): at least L + two 1 us cables (a GPU to its leaf and back)
    host = {v: node.host for v, node in enumerate(topo.nodes) if node.kind == "gpu"}
    fabric = [c for c in two if c.size and host[c.src] != host[c.dst]]
    assert len(fabric) == 4 * 6 and min(c.end_ns - c.start_ns for c in fabric) >= 1000 + 2_000


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize("latency", ["1us", "1ns"])
def test_nic_latency_on_stepped_workers_writes_one_keyed_engines_files(latency: str, tmp_path: Path) -> None:
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.workload import load_workload

    topo = load_topology("testbed16")
    wl = load_workload(workload(tmp_path / "wl.toml"), world=topo.num_ranks)
    sets = ["nvlink=fluid", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=400000",
            "queue_sample_ns=700", f"nic_latency={latency}"]  # fmt: skip
    cfg = apply_overrides(PacketConfig(cc="dcqcn"), sets)
    lat = cfg.nic_latency
    assert lat == (1000 if latency == "1us" else 1)

    one = replay(wl, topo, cfg, tmp_path / "one", stepper=spawn_stepped)
    two = replay(wl, topo, dataclasses.replace(cfg, partition=2), tmp_path / "two", stepper=spawn_stepped)
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    counters = ("flows_submitted", "flows_completed", "data_packets", "acks", "pfc_pause", "pfc_resume", "decompose")
    assert {k: two[k] for k in counters} == {k: one[k] for k in counters}
    assert one["decompose"]["nic_latency_ns"] == lat  # type: ignore[index]
    assert two["partition"]["workers"] == 2 and two["partition"]["rounds"] > 1  # type: ignore[index]
    # the latency is in every fabric flow's FCT: at least L + two 1 us cables (a GPU to its leaf and back down)
    rows = [r.split(",") for r in (tmp_path / "one" / "flows.csv").read_text().splitlines()[1:]]
    host = {node.name: node.host for node in topo.nodes if node.kind == "gpu"}
    fabric = [r for r in rows if host[r[2]] != host[r[3]]]
    assert len(fabric) > 100 and min(int(r[10]) for r in fabric) >= lat + 2_000
    assert len((tmp_path / "one" / "pfc.csv").read_text().splitlines()) > 1000
    assert len((tmp_path / "one" / "queues.csv").read_text().splitlines()) > 100
