"""Queue sampling by owner across partition workers (issue 38): the merge of the workers' samples into one engine's
list, and the one-ns windows until a sampling start is known (the slow runs against one engine are in
tests/test_netsim_partition.py and tests/test_partition_fluid.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.cut_windows import BEFORE, NEVER, window_end
from phantora.netsim.observe import QueueSample
from phantora.netsim.record_order import merge_queue_samples


def q(t: int, node: int, port: int, prio: int = 3, b: int = 1000) -> QueueSample:
    return QueueSample(t, node, port, prio, b)


def test_merge_is_one_engines_order() -> None:
    """Worker 0 runs switches 4 and 6, worker 1 switch 5, sampled at one engine's instants (two periods, at
    phases 100 and 350): one engine lists each instant's rows by (node, port, class)."""
    w0 = [q(100, 4, 0), q(100, 6, 1), q(1100, 4, 0, 1), q(1100, 4, 0, 3), q(5350, 6, 2)]
    w1 = [q(100, 5, 3), q(2100, 5, 0), q(5350, 5, 0, b=0), q(6350, 5, 1)]
    got = merge_queue_samples([w0, w1])
    assert [(s.time_ns, s.node, s.port, s.prio) for s in got] == [
        (100, 4, 0, 3), (100, 5, 3, 3), (100, 6, 1, 3), (1100, 4, 0, 1), (1100, 4, 0, 3), (2100, 5, 0, 3),
        (5350, 5, 0, 3), (5350, 6, 2, 3), (6350, 5, 1, 3),
    ]  # fmt: skip


def test_no_samples_and_bad_input() -> None:
    assert merge_queue_samples([[], []]) == []
    with pytest.raises(PhantoraError, match="worker 1: queue sample 1"):
        merge_queue_samples([[q(100, 4, 0)], [q(1100, 5, 0), q(100, 5, 0)]])
    with pytest.raises(PhantoraError, match=r"two partition workers sampled queue \(4, 0, 3\) at 100 ns"):
        merge_queue_samples([[q(100, 4, 0)], [q(100, 4, 0)]])


def test_window_runs_one_ns_until_a_sampling_start_is_known() -> None:
    """The cap ends the window before glob + 1 (all of ns glob), under the lookahead; a release bound below it
    still wins."""
    assert window_end(500, 1000, NEVER, NEVER, -1) == (1500, BEFORE)
    assert window_end(500, 1000, NEVER, NEVER, -1, cap=501) == (501, BEFORE)
    assert window_end(500, 1000, NEVER, 500, -1, cap=501) == (500, "through")


def _phased_workload(path: Path) -> Path:
    """An all-to-all and a ring all-reduce 1 us after it, then all-to-alls issued at 1,000,350 ns and 2,000,777 ns,
    long after: the packet side has no flow between them, so one engine samples in several periods, each at its own
    start's phase."""
    path.write_text(
        'name = "phases"\n[defaults]\nranks = "all"\ndtype = "bf16"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "256KiB"\n'
        '[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "4MiB"\nafter = ["a2a"]\ngap = "1us"\n'
        '[[op]]\nname = "a2b"\nkind = "all_to_all"\nbytes = "256KiB"\nat = "1000350ns"\n'
        '[[op]]\nname = "a2c"\nkind = "all_to_all"\nbytes = "256KiB"\nat = "2000777ns"\n'
    )
    return path


@pytest.mark.slow
@pytest.mark.ns3
def test_stepped_workers_sample_queues_as_one_keyed_engine(tmp_path: Path) -> None:
    """`phantora replay` with ``nvlink=fluid`` on 2 stepped partition workers (testbed16, DCQCN, 400 KB buffers,
    a sample every 700 ns): queues.csv and every other file byte for byte one keyed engine's with the fluid side,
    over sampling periods of several phases (refused before: partition_stepped's `_check_config`)."""
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
    from phantora.replay import replay_inprocess
    from phantora.report.replay_report import write_replay_outputs
    from phantora.topology.loader import load_topology
    from phantora.workload import load_workload

    every = 700
    topo = load_topology("testbed16")
    wl = load_workload(_phased_workload(tmp_path / "wl.toml"), world=topo.num_ranks)
    sets = ["nvlink=fluid", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=400000",
            f"queue_sample_ns={every}"]  # fmt: skip
    cfg = apply_overrides(PacketConfig(cc="dcqcn"), sets)

    def replay(config: PacketConfig, out: Path) -> None:
        spec = EngineSpec("ns3", config)
        sim = make_engine(spec, topo, partitioner=run_partitioned_batches, stepper=spawn_stepped)
        try:
            res = replay_inprocess(wl, topo, sim)
            write_replay_outputs(out, res, workload=wl.name, topology=topo, network="ns3", engine=sim, spec=spec)
        finally:
            sim.close()

    replay(cfg, tmp_path / "one")
    replay(dataclasses.replace(cfg, partition=2), tmp_path / "two")
    for name in ("queues.csv", "flows.csv", "links.csv", "pfc.csv", "ecn_marks.csv", "cnps.csv", "drops.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    rows = (tmp_path / "one" / "queues.csv").read_text().splitlines()[1:]
    times = sorted({int(r.split(",")[0]) for r in rows})
    assert len(rows) > 100
    assert len({t % every for t in times}) >= 3  # three periods at least, at different phases
