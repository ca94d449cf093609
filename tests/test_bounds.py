"""`phantora.netsim.bounds.EarliestEnds`: a flow's earliest completion, and the bytes it carries (closed forms)."""

from __future__ import annotations

from phantora.netsim.base import Flow
from phantora.netsim.bounds import EarliestEnds
from phantora.topology.generators import dgx_host
from tests.stars import star

G, US = 10**9, 1000


def test_a_chain_is_bounded_by_line_rate_latency_and_delays() -> None:
    """1 MB over two 100G hops of 1 us: 80 us + 2 us; its dependant starts 500 ns after, a marker at release."""
    ee = EarliestEnds(star(3))
    first = Flow(1, 0, 1, 10**6)
    then = Flow(2, 1, 2, 10**6, deps=(1,), delay_ns=500)
    marker = Flow(3, 2, 2, 0, deps=(2,))
    ee.add([first, then, marker], t_start=7_000)
    one = 7_000 + 80_000 + 2 * US
    assert ee.bounds == {1: one, 2: one + 500 + 82_000, 3: one + 500 + 82_000}
    assert ee.earliest([2, 3], default=-1) == one + 82_500 and ee.earliest([], default=-1) == -1
    ee.done(1)
    assert 1 not in ee.bounds
    assert (ee.network_bytes, ee.fabric_bytes) == (2 * 10**6, 2 * 10**6)


def test_nvlink_only_bytes_are_not_fabric_bytes() -> None:
    """Inside one host the route crosses the NVSwitch, not a switch: network bytes, not fabric bytes."""
    ee = EarliestEnds(dgx_host(8))
    ee.add([Flow(1, 0, 1, 4096)], t_start=0)
    assert (ee.network_bytes, ee.fabric_bytes) == (4096, 0)
