"""A NIC latency on stepped partition workers (issue 38, item 1: `partition=N` with ``nvlink=fluid`` and
``nic_latency``; refused before by `partition_stepped`'s `_check_config`).

One engine runs `NicLatencySimulator` over ns-3: it holds each fabric flow until the ns before its first packet
(posted + L) and hands it to ns-3 then, without deps. The stepped driver stacks the same over its workers
(`factory.partitioned`), which stop where it may hand a flow over (`SteppedPartition.follow`). Slow (each worker
imports ns-3): an all-to-all, then a ring all-reduce, on testbed16 with 400 KB buffers (PFC across the cut), one
keyed engine against 2 stepped workers: every output file byte for byte, with queue samples, at L = 1 us and at
L = 1 ns (a flow handed over at its post ns).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from tests.test_partition_pfc import FILES, replay, workload


def test_nic_latency_with_reuse_is_refused_in_one_line() -> None:
    from phantora.netsim.partition_stepped import SteppedPartition

    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", nic_latency=1000, reuse="on",
                       partition=2)  # fmt: skip

    def no_workers(*_: object) -> None:
        raise AssertionError("refused before any worker starts")

    with pytest.raises(InputError, match="nic_latency with reuse=on is not combined") as err:
        SteppedPartition(load_topology("testbed16"), cfg, no_workers)
    assert err.value.field == "nic_latency"


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
