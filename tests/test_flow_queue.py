"""`Flow.queue` in the flow engine: a queue's flows go on the wire one at a time, in release order, each once the
one before has finished transmitting (not arrived), against closed forms of serialisation and propagation."""

from __future__ import annotations

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from tests.test_flow_engine import LAT, G, build, run, tx_ns

SIZE = 1_000_000


def _line() -> tuple[object, dict[str, int]]:
    return build([("h0", "s0", 100 * G), ("s0", "h1", 100 * G)])


def test_a_queues_flows_follow_each_other_on_the_wire() -> None:
    """Three 1 MB flows of one queue released at once: flow k transmits in [k T, (k + 1) T) and arrives 2 hops of
    propagation later (T = 1 MB over 100G), where without a queue all three share the link and end together."""
    topo, n = _line()
    t = tx_ns(SIZE, 100 * G)
    queued = run(topo, [Flow(i, n["h0"], n["h1"], SIZE, queue=7) for i in range(3)])
    assert queued == {i: (i * t, (i + 1) * t + 2 * LAT) for i in range(3)}
    shared = run(topo, [Flow(i, n["h0"], n["h1"], SIZE) for i in range(3)])
    assert shared == {i: (0, 3 * t + 2 * LAT) for i in range(3)}


def test_a_flow_released_later_waits_only_for_the_transmission_before_it() -> None:
    """A flow that depends on the first of its queue (a slot freed) starts at that one's arrival, after the
    second's transmission has ended: it does not wait for the second's arrival."""
    topo, n = _line()
    t = tx_ns(SIZE, 100 * G)
    flows = [
        Flow(0, n["h0"], n["h1"], SIZE, queue=3),
        Flow(1, n["h0"], n["h1"], 2 * SIZE, queue=3),
        Flow(2, n["h0"], n["h1"], SIZE, deps=(0,), queue=3),
    ]
    done = run(topo, flows)
    assert done[0] == (0, t + 2 * LAT)
    assert done[1] == (t, 3 * t + 2 * LAT)  # on the wire from the first's transmission end
    assert done[2] == (3 * t, 4 * t + 2 * LAT)  # released at t + 2 LAT, behind the second (until 3 t)


def test_queues_do_not_wait_for_each_other() -> None:
    """Two queues over one link share it as two flows do: the rate is max-min's, the order is per queue."""
    topo, n = _line()
    flows = [Flow(i, n["h0"], n["h1"], SIZE, queue=1 + i % 2) for i in range(4)]
    done = run(topo, flows)
    two = tx_ns(2 * SIZE, 100 * G)  # two flows at half rate each
    assert done[0] == done[1] == (0, two + 2 * LAT)
    assert done[2] == done[3] == (two, 2 * two + 2 * LAT)


def test_a_rate_capped_queue_carries_one_cap() -> None:
    """Capped flows of one queue move at the cap one after another: n of them take n x size / cap."""
    topo, n = _line()
    cap = 25 * G
    done = run(topo, [Flow(i, n["h0"], n["h1"], SIZE, rate_bps=cap, queue=9) for i in range(4)])
    assert max(end for _, end in done.values()) == 4 * tx_ns(SIZE, cap) + 2 * LAT


def test_a_bad_queue_id_names_its_field() -> None:
    topo, n = _line()
    with pytest.raises(InputError, match="queue"):
        FlowSimulator(topo).submit([Flow(1, n["h0"], n["h1"], SIZE, queue=-1)], at=0)


def test_the_queue_travels_on_the_bridge() -> None:
    """A flow's queue survives the bridge's row and column forms (the 13th field; a column that may be absent)."""
    from bridge.columns import flows_from_columns, flows_to_columns
    from bridge.protocol import flow_from_wire, flow_to_wire

    flows = [Flow(1, 0, 1, SIZE, queue=11), Flow(2, 0, 1, SIZE, deps=(1,), conn=4)]
    assert [flow_from_wire(flow_to_wire(f)) for f in flows] == flows
    assert len(flow_to_wire(flows[0])) == 13 and len(flow_to_wire(flows[1])) == 12
    assert flows_from_columns(flows_to_columns(flows)) == flows
    cols = flows_to_columns(flows[1:])
    del cols["queue"]
    assert flows_from_columns(cols) == flows[1:]


@pytest.mark.ns3
def test_packet_engine_sends_a_queue_one_flow_at_a_time(ns3_lib) -> None:
    """ns-3 (SetQueue): two 1 MB flows of one queue from h0 to two receivers go one after the other, as in the
    flow engine (the second's end near two serialisations, the first's near one), not side by side."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    topo, n = build([("h0", "s0", 100 * G), ("s0", "h1", 100 * G), ("s0", "h2", 100 * G)])
    flows = [Flow(0, n["h0"], n["h1"], SIZE, queue=5), Flow(1, n["h0"], n["h2"], SIZE, queue=5)]
    sim = make_engine(EngineSpec(network="ns3"), topo)
    try:
        sim.submit(flows, at=0)
        done = {c.flow_id: c.end_ns for c in sim.drain()}
    finally:
        sim.close()
    t = tx_ns(SIZE, 100 * G)
    assert done[0] == pytest.approx(t, rel=0.1)
    assert done[1] == pytest.approx(2 * t, rel=0.1)
