"""A stepped partition worker's round end in one packed call (issue 38): `PhantoraNetwork::CutRoundEnd`, read by
`phantora.netsim.cut_round.unpack_round_end`, gives what DrainCompletions, DrainLosses and CompletionBounds give."""

from __future__ import annotations

from array import array

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.cut_round import last_send_end, round_end, unpack_round_end
from phantora.netsim.packet_config import PacketConfig
from tests.test_cut_workers import TOPO, config


def test_unpack_reads_each_record_with_its_tag_and_holes() -> None:
    words = [2, 3, 1]  # two completions, three losses, one bound
    words += [7, 1, 2, 4096, 100, 900, (1 << 64) - 1, 3, 4, 0, 5, 5]
    words += [7, 0, 10, (1 << 64) - 1, 20, 30, 7, 40, 50]
    words += [11, 1234]
    tags = {7: "a2a", 8: "keep"}
    done, bounds = unpack_round_end(array("Q", words).tobytes(), tags)
    assert done == [
        Completion(7, 100, 900, 4096, 1, 2, "a2a", ((0, 10), (40, 50))),
        Completion((1 << 64) - 1, 5, 5, 0, 3, 4, "", ((20, 30),)),
    ]
    assert bounds == {11: 1234}
    assert tags == {8: "keep"}


@pytest.mark.parametrize(
    ("packed", "what"),
    [(b"\0" * 7, "7 bytes"), (b"", "fewer than its 3 counts"), (array("Q", [1, 0, 0]).tobytes(), "3 words")],
)
def test_unpack_refuses_a_short_or_partial_array(packed: bytes, what: str) -> None:
    with pytest.raises(PhantoraError, match=f"CutRoundEnd: .*{what}"):
        unpack_round_end(packed, {})


def test_one_call_equals_the_three() -> None:
    """Two engines, one after the other, run the same flows to 8 us (the 10 kB flow done, the 4 MB one sending):
    one drains its round the old way, the other by CutRoundEnd; the same completions, and a bound past the clock
    for the open flow."""
    from phantora.netsim.packet import Ns3Simulator

    hosts = TOPO.endpoints
    flows = [Flow(0, hosts[0], hosts[1], 10_000, tag="small"), Flow(1, hosts[2], hosts[3], 4_000_000)]
    with Ns3Simulator(TOPO, config("dcqcn", None)) as a:  # (one ns-3 network a process at a time)
        a.submit(flows, 0)
        a._net.RunUntil(8_000)
        old = (a.take_completions(), a.completion_bounds())
    with Ns3Simulator(TOPO, config("dcqcn", None)) as b:
        b.submit(flows, 0)
        b._net.RunUntil(8_000)
        new = round_end(b)
    assert new == old
    assert [c.flow_id for c in new[0]] == [0] and new[0][0].tag == "small"
    assert list(new[1]) == [1] and new[1][1] > 8_000


def test_last_send_end_is_a_sender_s_bytes_at_line_rate() -> None:
    """One GPU sends three 1 MiB flows at once and a fourth that waits on one of them (not started yet), on a rail
    fabric of 100 Gb/s links of 1 us: `last_send_end` is its 4 MiB at line rate plus the least propagation (two
    cables), less 2 ns, at most a packet of rounding below (one may have left); far above the greatest per-flow
    bound (one flow's 1 MiB), never after the last completion, and within its headers and store and forward of it."""
    from phantora.netsim.packet import Ns3Simulator
    from tests.test_decompose import _G100, gpu, tiny

    topo = tiny()
    size = 1 << 20
    a = gpu(topo, 0, 0)
    flows = [Flow(i, a, gpu(topo, 1 + i % 2, 0), size, key=i) for i in range(3)]
    flows.append(Flow(3, a, gpu(topo, 2, 0), size, (1,), key=3))
    with Ns3Simulator(topo, PacketConfig(cc="dcqcn", payload_bytes=4096, header_bytes=62)) as sim:
        sim.submit(flows, 0)
        sim._net.RunUntil(0)
        b0 = last_send_end(sim)
        per_flow = max(sim.completion_bounds().values())
        seen = [b0]
        ends: list[int] = []
        t = 0
        while len(ends) < 4:
            t += 20_000
            sim._net.RunUntil(t)
            ends += [c.end_ns for c in sim.take_completions()]
            if len(ends) < 4:
                seen.append(last_send_end(sim))
        assert last_send_end(sim) is None  # nothing left to send
    closed = 4 * size * 8 * 10**9 // _G100 + 2 * 1000 - 2
    packet_ns = 4096 * 8 * 10**9 // _G100
    assert b0 is not None and closed - packet_ns - 1 <= b0 <= closed
    assert b0 > 3 * per_flow
    assert all(b is not None and b <= max(ends) for b in seen)
    assert max(ends) - b0 < 0.03 * max(ends)
