"""A stepped partition worker's round end in one packed call (issue 38): `PhantoraNetwork::CutRoundEnd`, read by
`phantora.netsim.cut_round.unpack_round_end`, gives what DrainCompletions, DrainLosses and CompletionBounds give."""

from __future__ import annotations

from array import array

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.cut_round import round_end, unpack_round_end
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
