"""`plain_batch`: a batch it passes is one the flow-by-flow check passes with the same ids, and it passes no batch
with any of the faults that check names."""

from __future__ import annotations

import dataclasses
import random

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow, check_flow_batch, checked_one_by_one
from phantora.netsim.batch_fast import plain_batch
from phantora.topology.loader import load_topology

TOPO = load_topology("testbed16")
ENDS = sorted(TOPO.endpoint_set)
KNOWN = frozenset(range(1000, 1010))  # ids of an earlier batch


def _known(i: int) -> bool:
    return i in KNOWN


def _batch(rng: random.Random, n: int) -> list[Flow]:
    """n flows in dependency order, ids from 50 with gaps, deps on earlier ones and on known flows."""
    flows: list[Flow] = []
    fid = 50
    for _ in range(n):
        fid += rng.randint(1, 3)
        pool = [f.id for f in flows] + sorted(KNOWN)
        deps = tuple(rng.sample(pool, min(len(pool), rng.randint(0, 3))))
        src, dst = rng.choice(ENDS), rng.choice(ENDS)
        flows.append(Flow(fid, src, dst, rng.randint(0, 9), deps, rng.randint(0, 5), conn=rng.randint(0, 7)))
    return flows


FAULTS = {
    "duplicate id": lambda fl, i: dataclasses.replace(fl[i], id=fl[i - 1].id),
    "id of an earlier batch": lambda fl, i: dataclasses.replace(fl[i], id=1003),
    "unknown dep": lambda fl, i: dataclasses.replace(fl[i], deps=(*fl[i].deps, 7)),
    "dep on itself": lambda fl, i: dataclasses.replace(fl[i], deps=(fl[i].id,)),
    "not an endpoint": lambda fl, i: dataclasses.replace(fl[i], dst=10**6),
    "negative size": lambda fl, i: dataclasses.replace(fl[i], size=-1),
    "negative delay": lambda fl, i: dataclasses.replace(fl[i], delay_ns=-1),
    "negative rate": lambda fl, i: dataclasses.replace(fl[i], rate_bps=-1),
    "conn past 64 bits": lambda fl, i: dataclasses.replace(fl[i], conn=1 << 64),
    "negative queue": lambda fl, i: dataclasses.replace(fl[i], queue=-1),
}


@pytest.mark.parametrize("seed", range(10))
def test_a_passed_batch_passes_flow_by_flow_with_the_same_ids(seed: int) -> None:
    flows = _batch(random.Random(seed), 40)
    got = plain_batch(flows, TOPO.endpoint_set, _known)
    assert got == {f.id for f in flows} == checked_one_by_one(flows, TOPO, _known)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_faulty_batch_is_left_to_the_flow_by_flow_check(fault: str) -> None:
    flows = _batch(random.Random(7), 30)
    flows[20] = FAULTS[fault](flows, 20)
    assert plain_batch(flows, TOPO.endpoint_set, _known) is None
    with pytest.raises(InputError, match=rf"\b{flows[20].id}\b"):
        check_flow_batch(flows, TOPO, _known)  # (the flow named as before)


def test_deps_out_of_order_pass_flow_by_flow_not_here() -> None:
    a, b = Flow(1, ENDS[0], ENDS[1], 5), Flow(2, ENDS[1], ENDS[2], 5, (3,))
    c = Flow(3, ENDS[2], ENDS[3], 5)
    assert plain_batch([a, b, c], TOPO.endpoint_set, _known) is None  # b waits on a later flow: no cycle, still fine
    assert check_flow_batch([a, b, c], TOPO, _known) == {1, 2, 3}
