"""ns-3's batch calls (issue 38, a decomposition worker's insertions and steps): flows without deps go to ns-3 in one
AddFlows call, and a run to the next completion comes back with its records in one StepToCompletion call, as
8-byte words; what ns-3 does with them is what one call a flow and a record did."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.packet import Ns3Simulator, unpack_step
from phantora.netsim.packet_config import PacketConfig
from tests.test_packet_engine import US, star, wire_ns

G = 10**9
BIG = (1 << 63) + 5  # an id above 2^63: read back unsigned


def _words(*values: int) -> memoryview:
    return memoryview(array("Q", values).tobytes()).cast("Q")


def test_step_words_give_completions_with_tags_and_losses() -> None:
    tags = {BIG: "a", 9: "keep"}
    words = _words(0, 2, 2, BIG, 3, 4, 4096, 100, 900, 7, 5, 6, 10, 200, 950, 7, 0, 1000, 7, 2000, 48)
    got = unpack_step(words, tags)
    assert got == [
        Completion(BIG, 100, 900, 4096, 3, 4, "a", ()),
        Completion(7, 200, 950, 10, 5, 6, "", ((0, 1000), (2000, 48))),
    ]
    assert tags == {9: "keep"}  # (popped as taken)
    assert unpack_step(_words(15, 0, 0), {}) == []  # (the signal word is the caller's)
    with pytest.raises(PhantoraError, match="StepToCompletion: 5 words for counts 1/0"):
        unpack_step(_words(0, 1, 0, 1, 2), {})


@pytest.mark.ns3
def test_a_batch_added_in_one_call_runs_as_its_closed_forms(ns3_lib: Any) -> None:
    """Three flows of host 0 in one AddFlows call: two on one queue to host 1 (the second sends once the first's
    last byte has left: two lone transfers back to back) and a third to host 2 beside them (host 0's NIC then
    shares its port: not timed here); a fourth batch flow on hosts 3 -> 4 alone, lone closed form. Each step
    comes back through StepToCompletion with its tag and endpoints."""
    size, payload = 1_000_000, 1000
    pkt = wire_ns(payload + 48, 100 * G)
    lone = size // payload * pkt + pkt + 2 * US
    flows = [Flow(BIG, 3, 4, size, tag="lone"), Flow(1, 0, 1, size, queue=5, tag="q1"), Flow(2, 0, 1, size, queue=5)]
    with Ns3Simulator(star(5), PacketConfig()) as sim:
        assert sim._add_packed and sim._step_packed
        sim.submit(flows, at=0)
        done: list[Completion] = []
        while sim.in_flight():
            done += sim.advance_to_completion(1 << 62)
    by_id = {c.flow_id: c for c in done}
    assert sorted(by_id) == [1, 2, BIG]
    assert (by_id[BIG].src, by_id[BIG].dst, by_id[BIG].tag, by_id[1].tag, by_id[2].tag) == (3, 4, "lone", "q1", "")
    assert abs(by_id[BIG].end_ns - lone) <= 5
    assert abs(by_id[1].end_ns - lone) <= 5
    assert abs(by_id[2].end_ns - (lone + size // payload * pkt)) <= 10, (by_id[2].end_ns, lone)


@pytest.mark.ns3
def test_a_bad_flow_in_a_batch_is_refused_in_one_line(ns3_lib: Any) -> None:
    with Ns3Simulator(star(3), PacketConfig()) as sim:
        sim.prechecked = True  # (as a decomposition worker: C++ finds it)
        with pytest.raises(InputError) as err:
            sim.submit([Flow(1, 0, 1, 4096), Flow(2, 0, 1, 4096, priority=0)], at=0)
    assert err.value.field == "flows" and "flow 2" in str(err.value) and "\n" not in str(err.value)
