"""bench/bench_decompose.py's hand-off count: the distinct ns a finished flow releases one on the other side."""

from __future__ import annotations

from script_modules import load

from phantora.netsim.base import Flow

bench = load("bench/bench_decompose.py")


def _flow(fid: int, *deps: int) -> Flow:
    return Flow(fid, 0, 1, 1, deps)


def test_a_handoff_is_a_release_ns_whose_last_dep_is_on_the_other_side() -> None:
    """Fabric 0 (ends 10) and 1 (ends 20), NVLink 2 (ends 20), 3 after 0 and 2 (released at 20 by NVLink 2: same
    side, no hand-off), 4 after 0 and 1 (fabric 1 ends last: a hand-off at 20), 5 after 0 (at 10), 6 after 1 (at 20
    again: the same ns), fabric 7 after 2 (NVLink -> fabric at 20), fabric 8 after 0 (same side)."""
    inside = {0: False, 1: False, 2: True, 3: True, 4: True, 5: True, 6: True, 7: False, 8: False}
    ends = {0: 10, 1: 20, 2: 20, 3: 30, 4: 30, 5: 30, 6: 30, 7: 30, 8: 30}
    flows = [_flow(0), _flow(1), _flow(2), _flow(3, 0, 2), _flow(4, 0, 1), _flow(5, 0), _flow(6, 1)]
    flows += [_flow(7, 2), _flow(8, 0)]
    assert bench.handoffs(flows, ends, inside) == (2, 1)  # fabric -> NVLink at {10, 20}, NVLink -> fabric at {20}


def test_a_tie_at_the_release_ns_counts_if_any_dep_then_crosses() -> None:
    """NVLink 2 waits on fabric 0 and NVLink 1, both ending at 5: the fabric one ends then too, a hand-off."""
    inside = {0: False, 1: True, 2: True}
    assert bench.handoffs([_flow(0), _flow(1), _flow(2, 0, 1)], {0: 5, 1: 5, 2: 9}, inside) == (1, 0)
    assert bench.handoffs([_flow(0), _flow(1), _flow(2, 0, 1)], {0: 4, 1: 5, 2: 9}, inside) == (0, 0)
