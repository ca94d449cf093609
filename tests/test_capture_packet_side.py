"""bench/capture_packet_side.py's tap on an ns-3 engine, and bench/bench_partition.py reading what it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from script_modules import load

from bridge.columns import completions_to_columns, flows_to_columns
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow

capture = load("bench/capture_packet_side.py")
partition_bench = load("bench/bench_partition.py")


class _Engine:
    """Stands in for an Ns3Simulator: keeps what it is given, completes flow 2 on the second advance."""

    def __init__(self) -> None:
        self.got: list[tuple[int, list[Flow]]] = []
        self.calls = 0

    def submit(self, flows: list[Flow], at: int, dports: Any = None) -> None:
        self.got.append((at, list(flows)))

    def advance(self, until: int) -> list[Completion]:
        self.calls += 1
        return [Completion(2, 0, until, 10, 8, 0)] if self.calls == 2 else []

    def advance_to_completion(self, until: int) -> list[Completion]:
        return []

    def advance_watching(self, until: int, watch: Any, earliest: Any = None) -> list[Completion]:
        return []


def test_the_tap_records_batches_and_completions_and_passes_them_on() -> None:
    engine = _Engine()
    tap = capture.Tap(engine)
    flows = [Flow(1, 0, 8, 100), Flow(2, 8, 0, 100, (1,))]
    engine.submit(flows, 50)
    engine.submit([], 60)  # an empty batch is passed on, not recorded
    assert engine.advance(100) == []
    assert engine.advance(200) == [Completion(2, 0, 200, 10, 8, 0)]
    assert tap.batches == [(50, flows)]
    assert engine.got == [(50, flows), (60, [])]
    assert tap.done == [Completion(2, 0, 200, 10, 8, 0)]
    assert tap.cpu_s >= 0.0


def test_find_ns3_refuses_a_packet_side_without_an_ns3_engine() -> None:
    class Hybrid:
        packet = object()

    with pytest.raises(InputError, match="no ns-3 engine"):
        capture.find_ns3(Hybrid())


def test_bench_partition_reads_a_capture(tmp_path: Path) -> None:
    flows = [Flow(1, 0, 8, 4096), Flow(2, 8, 0, 4096, (1,), delay_ns=7)]
    done = [Completion(1, 10, 900, 4096, 0, 8)]
    cap = {"topology": "testbed16", "sets": ["cc=dcqcn", "nvlink=fluid"], "until": 1000,
           "batches": [[10, flows_to_columns(flows)]], "done": completions_to_columns(done)}  # fmt: skip
    path = tmp_path / "cap.msgpack"
    path.write_bytes(msgpack.packb(cap))
    topo, cfg, batches, until, live = partition_bench.captured(str(path))
    assert topo.name == "testbed16"
    assert (cfg.cc, cfg.nvlink, until) == ("dcqcn", "fluid", 1000)
    assert batches == [(10, flows)]
    assert live == [(1, 10, 900)]
