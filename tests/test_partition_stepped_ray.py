"""Stepped partition workers placed by Ray (issue 38, item 1: ``partition=N`` with ``nvlink=fluid`` and ``ray``;
refused before by `partition_stepped`'s `_check_config`; `bridge.cut_stepped_ray`).

Slow (Ray starts a private instance, each worker imports ns-3): the all-to-all then ring all-reduce of
tests/test_partition_pfc.py on testbed16 (400 KB buffers: PFC across the cut; queue samples; a 1 us NIC latency),
on 2 stepped workers started by Ray actors with CurveZMQ between them (PHANTORA_BRIDGE_CURVE=1, as beyond
loopback), against one keyed engine: every output file byte for byte. A worker that cannot read its round exits,
and the driver ends the run naming it (its pid, its actor, its endpoint) and its last words.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridge.transport import CURVE_ALWAYS, STARTUP_ENV
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from tests.test_partition_pfc import FILES, replay, workload


@pytest.mark.slow
@pytest.mark.ns3
def test_stepped_workers_on_ray_over_curve_write_one_keyed_engines_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    monkeypatch.setenv(CURVE_ALWAYS, "1")
    monkeypatch.setenv(STARTUP_ENV, "900")  # a loaded machine importing ns-3 in three processes
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.workload import load_workload

    topo = load_topology("testbed16")
    wl = load_workload(workload(tmp_path / "wl.toml"), world=topo.num_ranks)
    sets = ["nvlink=fluid", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=400000",
            "queue_sample_ns=700", "nic_latency=1us"]  # fmt: skip
    cfg = apply_overrides(PacketConfig(cc="dcqcn"), sets)
    one = replay(wl, topo, cfg, tmp_path / "one", stepper=spawn_stepped)
    cfg2 = dataclasses.replace(cfg, partition=2, ray="local")
    two = replay(wl, topo, cfg2, tmp_path / "two", stepper=spawn_stepped)
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    part = two["partition"]
    assert part["workers"] == 2 and part["curve"] and part["rounds"] > 1  # type: ignore[index]
    assert two["decompose"]["placement"] == "ray:local" and one["decompose"]["placement"] == "local"  # type: ignore[index]
    assert len((tmp_path / "one" / "pfc.csv").read_text().splitlines()) > 1000


@pytest.mark.slow
@pytest.mark.ns3
def test_a_stepped_worker_dying_on_ray_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    monkeypatch.setenv(STARTUP_ENV, "900")
    from bridge.cut_stepped_start import spawn_stepped

    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", partition=2, ray="local")
    pool = spawn_stepped(load_topology("testbed16"), cfg, [[0]])
    try:
        pool._send({"k": "round", "groups": [[0, {"id": "not columns"}]], "until": 10})
        named = r"partition worker \d \(pid \d+, Ray actor, at tcp://127\.0\.0\.1:\d+\) mid-run: exited with code 1: "
        named += ".*bad column"
        with pytest.raises(WorkerDiedError, match=named):
            pool._gather()
    finally:
        pool.close()
