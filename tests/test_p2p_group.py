"""A group of p2p transfers with any bytes per pair (nccl/p2p_group.py) against closed forms: an even group is the
all-to-all, a two-way exchange is two send/recvs, a gather's root shares its receive side, and a skewed group's
large transfer speeds up to a send/recv's rate once the small ones are done.

NCCL's figures restated: an H100's NVLink moves 20.6 GB/s in NCCL's units (`NVLINK_BW_PER_LINK`); on 8 ranks a
transfer runs on nChannelsMin = 32 p2p channels / 8 ranks = 4 channels from 4 x 64 KiB (the NVLink chunk's eighth
is the least part), 1 channel up to 64 KiB; round k of an 8-GPU node starts at channel bitrev5(k): 16, 8, 24, 4, 20,
12, 28 for k = 1..7, so the rounds' parts never share a channel (at most 4 parts each); a Simple transfer's latency
is the ring's base plus one NVLink step, 6.8 + 5 = 11.8 us (NCCL's tuning.cc tables)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.p2p_group import channel_links
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host, load_topology

KiB, MiB = 1 << 10, 1 << 20
LINK = 20.6  # GB/s, NCCL's H100 NVLink
LAT_SIMPLE = 6.8 + 5.0  # us, ring base + NVLink hop, Simple
HOST = dgx_host(8, gpu="h100")
OPTS = AlgoOptions(nccl_env=nccl_env({}))
RANKS = tuple(range(8))


def grouped(sizes: dict[tuple[int, int], int], own: tuple[int, int], topo=HOST, ranks=RANKS):
    """The choice of `own` in the group `sizes` (all starting together), as the coordinator asks it."""
    at = tuple((a, b, 0, n) for (a, b), n in sizes.items() if n != sizes[own] and (a, b) != own)
    coll = Collective("send_recv", own, sizes[own], "uint8", comm=ranks, inflight=tuple(sizes), inflight_at=at)
    return choose(coll, topo, OPTS)


def test_the_fan_out_interpolates_between_the_measured_ends() -> None:
    assert channel_links(1, 7) == 1.0  # sendrecv_perf: a link a channel
    assert channel_links(7, 7) == 0.5  # alltoall_perf on 8 H100s: half a link a channel
    assert channel_links(4, 7) == pytest.approx(0.75)  # halfway in fan-out, halfway in rate
    assert channel_links(1, 1) == 1.0  # two ranks: each has one peer


@pytest.mark.parametrize("per_peer", [1 * KiB, 64 * KiB, 1 * MiB, 8 * MiB, 64 * MiB])
def test_an_even_group_is_the_all_to_all(per_peer: int) -> None:
    a2a = choose(Collective("all_to_all", RANKS, per_peer * 8, "uint8"), HOST, OPTS)
    sizes = {(a, b): per_peer for a in RANKS for b in RANKS if a != b}
    for own in [(0, 1), (3, 7), (6, 2)]:
        c = grouped(sizes, own)
        assert (c.protocol, c.channels) == (a2a.protocol, a2a.channels)
        assert c.time_us == pytest.approx(a2a.time_us, rel=1e-12)


@pytest.mark.parametrize("per_peer", [1 * MiB, 8 * MiB])
def test_an_even_group_across_two_hosts_is_the_all_to_all(per_peer: int) -> None:
    topo, ranks = load_topology("testbed16"), tuple(range(16))
    a2a = choose(Collective("all_to_all", ranks, per_peer * 16, "uint8"), topo, OPTS)
    sizes = {(a, b): per_peer for a in ranks for b in ranks if a != b}
    slowest = max(grouped(sizes, own, topo, ranks).time_us for own in [(0, 8), (0, 1), (9, 3)])
    assert slowest == pytest.approx(a2a.time_us, rel=1e-12)


def test_a_two_way_uneven_exchange_is_two_send_recvs() -> None:
    sizes = {(0, 1): 8 * MiB, (1, 0): 2 * MiB}  # each GPU has one peer each way: a link a channel, 4 channels
    for own, nbytes in sizes.items():
        c = grouped(sizes, own)
        lone = choose(Collective("send_recv", own, nbytes, "uint8", comm=RANKS), HOST, OPTS)
        assert c.channels == lone.channels == 4
        assert c.time_us == pytest.approx(LAT_SIMPLE + nbytes / (4 * LINK) / 1e3, rel=1e-9)
        assert c.time_us == pytest.approx(lone.time_us, rel=1e-9)


@pytest.mark.parametrize("ranks", [(0, 1), (0, 8)])
def test_a_two_rank_all_to_all_is_a_send_recv_exchange(ranks: tuple[int, int]) -> None:
    """On 2 ranks an all-to-all sends its one peer its half, as a send/recv each way does: each GPU has one peer in
    flight, so a channel moves a link (`channel_links(1, 1)`), not the half of all peers on 8 (before: half, twice
    the time). Inside an H100 host 64 MiB on the transfer's c channels takes 11.8 us + 64 MiB / (c x 20.6 GB/s);
    across testbed16's hosts both are the same one remote transfer each way."""
    topo = load_topology("testbed16")
    per_peer = 64 * MiB
    a2a = choose(Collective("all_to_all", ranks, 2 * per_peer, "uint8"), topo, OPTS)
    pair = choose(Collective("send_recv", ranks, per_peer, "uint8"), topo, OPTS)
    two_way = grouped({ranks: per_peer, ranks[::-1]: per_peer}, ranks, topo, ranks)
    assert a2a.channels == pair.channels == two_way.channels
    assert a2a.time_us == pytest.approx(pair.time_us, rel=1e-9)
    assert a2a.time_us == pytest.approx(two_way.time_us, rel=1e-9)
    if ranks == (0, 1):
        assert a2a.time_us == pytest.approx(LAT_SIMPLE + per_peer / (a2a.channels * LINK) / 1e3, rel=1e-9)


def test_a_skewed_group_s_large_transfer_runs_alone_once_the_small_ones_end() -> None:
    big, small = 16 * MiB, 64 * KiB  # 0 -> 1 on 4 channels; every other pair 1 channel, Simple (> 16 KiB)
    sizes = {(a, b): small for a in RANKS for b in RANKS if a != b}
    sizes[(0, 1)] = big
    # all in flight: every GPU has 7 peers each way, half a link a channel; the rounds' channels are distinct, so
    # each transfer has its own channels' rate: the small ones 0.5 LINK, the large one 4 x 0.5 LINK
    t1 = small / (0.5 * LINK)  # ns
    left = big - 4 * 0.5 * LINK * t1
    t_big = t1 + left / (4 * LINK)  # then alone: one peer each way, a link a channel
    assert grouped(sizes, (0, 1)).time_us == pytest.approx(LAT_SIMPLE + t_big / 1e3, rel=1e-9)
    assert grouped(sizes, (2, 5)).time_us == pytest.approx(LAT_SIMPLE + t1 / 1e3, rel=1e-9)
    assert grouped(sizes, (0, 1)).channels == 4


def test_a_transfer_that_starts_later_slows_the_sender_s_first_one_from_then_on() -> None:
    """GPU 0 sends 8 MiB to 1 alone (one peer: a link a channel, 4 channels) until its 8 MiB to 2 starts 20 us later
    (rounds 1 and 2: channels 16-19 and 8-11, distinct); then it has 2 of its 7 peers in flight, 1 - 0.5/6 = 11/12
    of a link a channel, each transfer 4 of the 8 channels; the second runs alone again once the first ends."""
    part, later = 8 * MiB, 20_000  # bytes, ns
    alone, shared = 4 * LINK, 8 * (11 / 12) * LINK * 4 / 8  # bytes per ns
    t_first = later + (part - alone * later) / shared
    t_second = t_first + (part - shared * (t_first - later)) / alone  # from its own start
    for own, other, start, end in [((0, 1), (0, 2), later, t_first), ((0, 2), (0, 1), -later, t_second - later)]:
        coll = Collective(
            "send_recv", own, part, "uint8", comm=RANKS, inflight=(own, other), inflight_at=((*other, start, part),)
        )
        assert choose(coll, HOST, OPTS).time_us == pytest.approx(LAT_SIMPLE + end / 1e3, rel=1e-9)


def test_a_gather_s_root_shares_its_receive_side() -> None:
    part = 8 * MiB  # 4 channels each; the root receives on 7 x 4 = 28 distinct channels at half a link each
    sizes = {(j, 0): part for j in range(1, 8)}
    c = grouped(sizes, (3, 0))
    root_side = 28 * 0.5 * LINK  # GB/s into the root, shared by its 7 senders
    assert c.time_us == pytest.approx(LAT_SIMPLE + 7 * part / root_side / 1e3, rel=1e-9)


def test_a_scatter_from_the_root_is_the_gather_reversed() -> None:
    part = 8 * MiB
    gather = grouped({(j, 0): part for j in range(1, 8)}, (3, 0))
    scatter = grouped({(0, j): part for j in range(1, 8)}, (0, 5))
    assert scatter.time_us == pytest.approx(gather.time_us, rel=1e-12)


def test_small_transfers_run_ll_at_half_rate() -> None:
    sizes = {(0, 1): 8 * KiB, (1, 0): 1 * MiB}  # 8 KiB on 1 channel: LL (at most 16 KiB a channel)
    c = grouped(sizes, (0, 1))
    assert (c.protocol, c.channels) == ("LL", 1)
    assert c.algbw == pytest.approx(0.5 * LINK, rel=1e-9)


def _replay(ops: list[dict]):
    from phantora.netsim.flow import FlowSimulator
    from phantora.replay import replay_inprocess
    from phantora.workload import workload_from_dict

    wl = workload_from_dict({"op": ops}, world=8)
    return wl, {r.name: r for r in replay_inprocess(wl, HOST, FlowSimulator(HOST), OPTS).ops}


def test_a_workload_s_all_to_all_with_splits_is_the_group() -> None:
    big, small = 16 * MiB, 64 * KiB
    splits = [[0 if i == j else big if (i, j) == (0, 1) else small for j in range(8)] for i in range(8)]
    wl, recs = _replay([{"name": "dispatch", "kind": "all_to_all", "splits": splits}, {"name": "next",
                        "kind": "all_reduce", "bytes": 4, "after": "dispatch"}])  # fmt: skip
    assert len([op for op in wl.ops if op.group == "dispatch"]) == 56
    t1 = small / (0.5 * LINK)
    t_big = t1 + (big - 4 * 0.5 * LINK * t1) / (4 * LINK)  # as the skewed group above
    assert recs["dispatch/0>1"].duration_ns == pytest.approx(LAT_SIMPLE * 1e3 + t_big, abs=2)
    assert recs["dispatch/2>5"].duration_ns == pytest.approx(LAT_SIMPLE * 1e3 + t1, abs=2)
    assert recs["next"].start_ns >= recs["dispatch/0>1"].end_ns  # `after` the group: after all its transfers


def test_a_workload_s_even_splits_take_the_all_to_all_s_time() -> None:
    part = 1 * MiB
    splits = [[0 if i == j else part for j in range(8)] for i in range(8)]
    _, even = _replay([{"name": "a2a", "kind": "all_to_all", "bytes": 8 * part}])
    _, split = _replay([{"name": "a2a", "kind": "all_to_all", "splits": splits}])
    assert max(r.end_ns for r in split.values()) == even["a2a"].end_ns


def test_splits_round_trip_and_bad_ones_are_one_line_errors() -> None:
    from phantora.errors import InputError
    from phantora.workload import workload_from_dict, workload_to_dict

    splits = [[0, "1MiB", 0, 5], [7, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 0]]
    raw = {"op": [{"name": "a", "kind": "all_to_all", "ranks": [0, 1, 2, 3], "splits": splits, "repeat": 2}]}
    wl = workload_from_dict(raw, world=8)
    back = workload_to_dict(wl)
    assert [op["name"] for op in back["op"]] == ["a.0", "a.1"] and back["op"][1]["after"] == ["a.0"]
    assert back["op"][0]["splits"] == [[0, MiB, 0, 5], [7, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 0]]
    assert workload_to_dict(workload_from_dict(back, world=8)) == back
    for bad, what in [([[0, 1], [1, 0]], "4 rows of 4"), ([[0, -1, 0, 0]] * 4, ">= 0"), ([[0] * 4] * 4, "no bytes")]:
        with pytest.raises(InputError, match=what) as err:
            workload_from_dict({"op": [{"kind": "all_to_all", "ranks": [0, 1, 2, 3], "splits": bad}]}, world=8)
        assert "\n" not in str(err.value) and err.value.field == "splits"
    with pytest.raises(InputError, match="all_to_all's"):
        workload_from_dict({"op": [{"kind": "all_gather", "ranks": [0, 1], "splits": [[0, 1], [1, 0]]}]}, world=8)


def test_a_group_s_flows_carry_each_transfer_s_protocol_bytes_at_its_rate() -> None:
    from phantora.collectives import decompose

    sizes = {(0, 1): 8 * KiB, (1, 0): 1 * MiB}  # the LL one: 16 B on the wire per 8 B of data, at half a link
    at = ((1, 0, 0, 1 * MiB),)
    ll = Collective("send_recv", (0, 1), 8 * KiB, "uint8", comm=RANKS, inflight=tuple(sizes), inflight_at=at)
    dag = decompose(ll, HOST, OPTS)
    assert [f.size for f in dag.flows] == [2 * 8 * KiB]
    assert dag.flows[0].rate_bps == pytest.approx(2 * 0.5 * LINK * 8e9, rel=1e-6)  # wire bits at the payload rate
    simple = Collective(
        "send_recv", (1, 0), MiB, "uint8", comm=RANKS, inflight=tuple(sizes), inflight_at=((0, 1, 0, 8 * KiB),)
    )
    flows = decompose(simple, HOST, OPTS).flows
    assert sum(f.size for f in flows) == MiB and len(flows) == 4  # Simple, on its 4 channels
