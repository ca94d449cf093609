"""One NCCL group object shared by a launch's pairs (collectives/launch_group.py, `Collective.launch`).

The coordinator hands every pair of a group launch the same `LaunchGroup` (bridge/p2p_batch.py), so the group's
checks, hosts and rating are made once for the launch, not once a pair: an uneven all-to-all on n ranks rates its
group once, where each of its n(n-1) pairs used to carry and read the whole group. Each pair's choice and flows are
those it gets when handed its group relative to itself (`inflight` / `inflight_at`), as before.
"""

from __future__ import annotations

import random

import pytest

import phantora.collectives.nccl.p2p_group as G
from bridge.matching import Call, Rendezvous
from bridge.p2p_batch import P2pBatches
from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.errors import InputError
from phantora.topology import load_topology

MiB = 1 << 20
N = 16  # testbed16: two hosts of 8 H100s
OPTS = AlgoOptions(nccl_env=nccl_env({}))


def _dispatch(seed: int = 0) -> tuple[P2pBatches, list[Rendezvous], tuple[int, ...]]:
    """An uneven all-to-all over N ranks as the coordinator meets it: every pair issued in its ranks' launches and
    held, none launched yet."""
    rng = random.Random(seed)
    comm = tuple(range(N))
    batches = P2pBatches()
    rvs = []
    for h, (s, d) in enumerate((s, d) for s in comm for d in comm if s != d):
        nbytes = rng.randrange(1, 65) * MiB // 16
        send = Call(s, 2 * h, "send", nbytes, "uint8", None, 0, comm=comm)
        recv = Call(d, 2 * h + 1, "recv", nbytes, "uint8", None, 0, comm=comm)
        batches.issued(send, 0)
        batches.issued(recv, 0)
        rvs.append(Rendezvous(("p2p", s, d, 0, 0), (s, d), {s: send, d: recv}))
    for rv in rvs:
        batches.held(rv)
    return batches, rvs, comm


def _call(rv: Rendezvous, comm: tuple[int, ...], **group: object) -> CallSpec:
    nbytes = next(iter(rv.calls.values())).nbytes
    return CallSpec("send_recv", (rv.key[1], rv.key[2]), nbytes, "uint8", None, "x", {}, comm, **group)  # type: ignore[arg-type]


def test_a_launchs_pairs_share_one_group_rated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """All N(N-1) pairs get the same object, and planning them all asks the group's rating once."""
    rated = []
    real = G.rate_group
    monkeypatch.setattr(G, "rate_group", lambda *a, **k: rated.append(1) or real(*a, **k))
    batches, rvs, comm = _dispatch()
    planner = CollectivePlanner(load_topology("testbed16"), OPTS, Mirrors(N, N))
    launches = [batches.launch(rv, 0) for rv in rvs]
    assert launches[0] is not None and len(launches[0].pairs) == N * (N - 1)
    assert all(g is launches[0] for g in launches)
    for rv, g in zip(rvs, launches, strict=True):
        planner.plan(_call(rv, comm, launch=g), "x")
    assert len(rated) == 1


def test_each_pair_plans_as_when_handed_its_group_relative_to_itself() -> None:
    """The flows and choice of every pair are the same from the shared group as from the group relative to the pair
    (what the coordinator handed each pair before: `inflight`, `inflight_at`), on two hosts (NVLink and network)."""
    topo = load_topology("testbed16")
    batches, rvs, comm = _dispatch(seed=1)
    shared = CollectivePlanner(topo, OPTS, Mirrors(N, N))
    apart = CollectivePlanner(topo, OPTS, Mirrors(N, N))
    for rv in rvs[:: N + 1]:  # a pair of every sender
        g = batches.launch(rv, 0)
        assert g is not None
        inflight, inflight_at = g.answer((rv.key[1], rv.key[2]))
        assert inflight_at  # an uneven group: other pairs move other bytes
        a = shared.plan(_call(rv, comm, launch=g), "x")
        b = apart.plan(_call(rv, comm, inflight=inflight, inflight_at=inflight_at), "x")
        assert (a.flows, a.last, a.choice) == (b.flows, b.last, b.choice)


def test_under_deduplication_a_launch_is_read_relative_to_the_pair() -> None:
    """With mirrored ranks the planner shifts the group for each copy: from the launch as from its relative form."""
    topo = load_topology("testbed16")
    batches, rvs, comm = _dispatch(seed=2)
    rv = next(rv for rv in rvs if rv.key[1:3] == (1, 10))
    g = batches.launch(rv, 0)
    assert g is not None
    inflight, inflight_at = g.answer((1, 10))
    a = CollectivePlanner(topo, OPTS, Mirrors(N, 8)).plan(_call(rv, comm, launch=g), "x")
    b = CollectivePlanner(topo, OPTS, Mirrors(N, 8)).plan(
        _call(rv, comm, inflight=inflight, inflight_at=inflight_at), "x"
    )
    assert a.copies == 2 and (a.flows, a.last, a.choice) == (b.flows, b.last, b.choice)


def test_a_launch_reads_its_own_start_and_bytes() -> None:
    """A pair's view of the group: the others' starts after its own, and only those that differ from it."""
    g = LaunchGroup(((0, 1), (1, 2), (2, 0)), (100, 100, 400), (MiB, 2 * MiB, MiB))
    assert g.answer((0, 1)) == (g.pairs, ((1, 2, 0, 2 * MiB), (2, 0, 300, MiB)))
    assert g.answer((2, 0)) == (g.pairs, ((0, 1, -300, MiB), (1, 2, -300, 2 * MiB)))
    assert LaunchGroup.relative((0, 1), MiB, g.pairs, ((1, 2, 0, 2 * MiB), (2, 0, 300, MiB))).answer(
        (0, 1)
    ) == g.answer((0, 1))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda g: Collective("send_recv", (0, 1), MiB, "uint8", comm=(0, 1, 2), launch=g), None),
        (lambda g: Collective("send_recv", (0, 2), MiB, "uint8", comm=(0, 1, 2), launch=g), "launch must hold"),
        (lambda g: Collective("send_recv", (0, 1), 2 * MiB, "uint8", comm=(0, 1, 2), launch=g), "launch must hold"),
        (lambda g: Collective("send_recv", (0, 1), MiB, "uint8", comm=(0, 1), launch=g), "pairs of comm"),
        (
            lambda g: Collective("send_recv", (0, 1), MiB, "uint8", comm=(0, 1, 2), inflight=g.pairs, launch=g),
            "not both",
        ),
        (lambda g: LaunchGroup(((0, 1), (0, 1)), (0, 0), (1, 1)), "distinct"),
        (lambda g: LaunchGroup(((0, 1),), (0,), (-1,)), ">= 0"),
        (lambda g: LaunchGroup(((0, 1),), (0, 1), (1,)), "as many"),
    ],
)
def test_a_bad_launch_is_a_one_line_error_naming_the_field(make, match) -> None:
    g = LaunchGroup(((0, 1), (1, 2)), (0, 0), (MiB, 2 * MiB))
    if match is None:
        assert make(g).in_flight is g
        return
    with pytest.raises(InputError, match=match) as err:
        make(g)
    assert err.value.field == "launch" and "\n" not in str(err.value)
