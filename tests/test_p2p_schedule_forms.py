"""NCCL's p2p round schedule and channel of each round, per release (p2p_schedule.py's forms).

Each expected order is written out by hand from NCCL's own loops at the tags named: init.cc "Setup p2p
structures" (v2.17.1-1 .. v2.21.5-1: node deltas d, -d, n/2 - d, -(n/2 - d), local steps in turn), init.cc
"Build p2p schedule" (v2.22.3-1 .. v2.28.3-1: node and local deltas both (x*x + x)/2 mod pow2Up), init.cc
`ncclP2pSchedule` (v2.28.7-1 on: groups of 8, group deltas quadratic, local deltas in turn); channel.h
`ncclChannelComputeBase` / `ncclP2pChannelBaseForRound` and device.h `ncclP2pChannelForPart` for the channels.
Quadratic deltas mod 4: 0 1 3 2; mod 8: 0 1 3 6 2 7 5 4; mod 16: init.cc's example, 0 1 3 6 10 15 5 12 4 13 7 2
14 11 9 8.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import summarize_choices
from phantora.collectives.nccl.p2p_schedule import send_rounds, transfer_channel_ids
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.errors import InputError
from tests.test_nccl_multinode import a100_hosts

PAIRED, QUADRATIC, GROUPED = (2, 21, 5), (2, 27, 3), (2, 29, 7)
QUAD8 = (0, 1, 3, 6, 2, 7, 5, 4)  # (x*x + x)/2 mod 8, x = 0 .. 7


def _nodes(n: int, per: int) -> tuple[int, ...]:
    return tuple(i // per for i in range(n * per))


def _blocks(order: list[int], per: int, locals_: tuple[int, ...]) -> tuple[int, ...]:
    """Peers node by node (`order`), each node's local ranks in `locals_` (nodes of `per` ranks)."""
    return tuple(per * node + local for node in order for local in locals_)


LINEAR3 = (3, 4, 5, 6, 7, 0, 1, 2)  # local rank 3 stepping 0 .. 7 in turn
QUADRATIC3 = tuple((3 + d) % 8 for d in QUAD8)  # 3 4 6 1 5 2 0 7


@pytest.mark.parametrize(
    ("v", "expected"),
    [(PAIRED, LINEAR3), (QUADRATIC, (3, 4, 6, 1, 5, 2, 0, 7)), (GROUPED, LINEAR3), ((2, 28, 7), LINEAR3)],
)
def test_one_node_of_eight(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """One node of 8, local rank 3: steps in turn (2.21), local deltas quadratic (2.27), one group (2.28.7+)."""
    assert send_rounds(_nodes(1, 8), 3, v) == expected


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (PAIRED, (11, 12, 13, 14, 15, 8, 9, 10, 3, 4, 5, 6, 7, 0, 1, 2)),
        (QUADRATIC, (11, 12, 14, 9, 13, 10, 8, 15, 3, 4, 6, 1, 5, 2, 0, 7)),
        (GROUPED, (11, 12, 13, 14, 15, 8, 9, 10, 3, 4, 5, 6, 7, 0, 1, 2)),
    ],
)
def test_two_nodes_of_eight(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """Rank 11 (node 1, local 3) of 2 nodes of 8: its own node first, then the other."""
    assert send_rounds(_nodes(2, 8), 11, v) == expected


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (PAIRED, _blocks([0, 1, 2], 8, LINEAR3)),  # n = 3: d = 0 gives 0, 3/2 - 0 = 1, -(1) = 2
        (QUADRATIC, _blocks([0, 1, 2], 8, QUADRATIC3)),  # mod 4: 0 1 (3) 2
        (GROUPED, _blocks([0, 1, 2], 8, LINEAR3)),
    ],
)
def test_three_nodes_of_eight(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert send_rounds(_nodes(3, 8), 3, v) == expected


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (PAIRED, _blocks([0, 2, 1, 3], 8, LINEAR3)),  # d = 0: 0, n/2 = 2; d = 1: 1, -1 = 3
        (QUADRATIC, _blocks([0, 1, 3, 2], 8, QUADRATIC3)),
        (GROUPED, _blocks([0, 1, 3, 2], 8, LINEAR3)),
    ],
)
def test_four_nodes_of_eight(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert send_rounds(_nodes(4, 8), 3, v) == expected


SIXTEEN_PAIRED = [0, 8, 1, 15, 7, 9, 2, 14, 6, 10, 3, 13, 5, 11, 4, 12]  # d = 0 .. 4: d, -d, 8 - d, -(8 - d)
SIXTEEN_QUADRATIC = [0, 1, 3, 6, 10, 15, 5, 12, 4, 13, 7, 2, 14, 11, 9, 8]  # init.cc's example


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (PAIRED, _blocks(SIXTEEN_PAIRED, 8, LINEAR3)),
        (QUADRATIC, _blocks(SIXTEEN_QUADRATIC, 8, QUADRATIC3)),
        (GROUPED, _blocks(SIXTEEN_QUADRATIC, 8, LINEAR3)),
    ],
)
def test_sixteen_nodes_of_eight(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert send_rounds(_nodes(16, 8), 3, v) == expected


@pytest.mark.parametrize(
    ("v", "two", "four"),
    [
        (PAIRED, (5, 6, 7, 4, 1, 2, 3, 0), _blocks([0, 2, 1, 3], 4, (1, 2, 3, 0))),
        (QUADRATIC, (5, 6, 4, 7, 1, 2, 0, 3), _blocks([0, 1, 3, 2], 4, (1, 2, 0, 3))),  # locals mod 4: 0 1 3 2
        (GROUPED, (5, 6, 7, 4, 1, 2, 3, 0), _blocks([0, 1, 3, 2], 4, (1, 2, 3, 0))),  # groups of gcd(8, 4) = 4
    ],
)
def test_nodes_of_four(v: tuple[int, ...], two: tuple[int, ...], four: tuple[int, ...]) -> None:
    """Rank 5 (node 1, local 1) of 2 nodes of 4; rank 1 of 4 nodes of 4."""
    assert send_rounds(_nodes(2, 4), 5, v) == two
    assert send_rounds(_nodes(4, 4), 1, v) == four


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (PAIRED, tuple(range(12))),  # steps 0 .. 7 on node 1: only local ranks 0 .. 3 exist
        (QUADRATIC, (0, 1, 3, 6, 10, 5, 4, 7, 2, 11, 9, 8)),  # flat: mod 16, those >= 12 skipped
        (GROUPED, tuple(range(12))),  # groups of gcd(8, 4) = 4: three, deltas 0 1 2
    ],
)
def test_nodes_of_unequal_ranks(v: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """A node of 8 and one of 4, rank 0."""
    assert send_rounds((0,) * 8 + (1,) * 4, 0, v) == expected


def test_one_node_of_sixteen_is_cut_in_groups_only_in_2_28_7() -> None:
    """v2.28.7-1 cuts one node of 16 into two groups of 8 (group deltas 0, 1); v2.28.9-1 keeps it one group."""
    assert send_rounds(_nodes(1, 16), 3, (2, 28, 7)) == _blocks([0, 1], 8, LINEAR3)
    assert send_rounds(_nodes(1, 16), 3, (2, 28, 9)) == (*range(3, 16), 0, 1, 2)


@pytest.mark.parametrize(
    ("v", "local", "remote"),
    [
        (PAIRED, [24, 25], [16, 17]),  # the peer's base: step 3 -> mirror(3) = 24; node delta 1 -> mirror(1) = 16
        ((2, 27, 7), [2, 18], [1, 17]),  # round 2 / base 1, parts at base + reverse(c): +0, +16
        ((2, 28, 3), [8, 9], [16, 17]),  # reverse(2) = 8; reverse(1) = 16
        (GROUPED, [24, 25], [16, 17]),  # round 3 (delta 3): reverse(3) = 24; batch 1: reverse(1) = 16
    ],
)
def test_channels_of_a_transfer(v: tuple[int, ...], local: list[int], remote: list[int]) -> None:
    """32 p2p channels (5 bits), 2 parts: rank 3 -> 6 on one node of 8, rank 3 -> 12 on 2 nodes of 8 (node delta
    1, local step 1: round 9 of the grouped form, round 8 + index of delta 1 = 9 of the quadratic form)."""
    assert transfer_channel_ids(_nodes(1, 8), 3, 6, 2, 32, v) == local
    assert transfer_channel_ids(_nodes(2, 8), 3, 12, 2, 32, v) == remote


def test_paired_bases_take_the_linear_node_delta() -> None:
    """4 nodes of 8, 32 channels: rank 3 -> 27 is node delta 3, step 0: base 3 -> mirror 24 up to 2.21; the grouped
    form sends to node 3 in rounds 16 .. 23 (group order 0 1 3 2): base 2 -> reverse(2) = 8."""
    assert transfer_channel_ids(_nodes(4, 8), 3, 27, 1, 32, PAIRED) == [24]
    assert transfer_channel_ids(_nodes(4, 8), 3, 27, 1, 32, GROUPED) == [8]


PROBES = (
    lambda v: send_rounds(_nodes(2, 8), 3, v),
    lambda v: transfer_channel_ids(_nodes(1, 8), 3, 6, 2, 32, v),
    lambda v: send_rounds(_nodes(1, 16), 3, v),
)


@pytest.mark.parametrize(
    ("first", "last", "next_"),
    [
        ((2, 17, 1), (2, 21, 5), (2, 22, 3)),
        ((2, 22, 3), (2, 27, 7), (2, 28, 3)),
        ((2, 28, 3), (2, 28, 3), (2, 28, 7)),
        ((2, 28, 7), (2, 28, 7), (2, 28, 9)),
    ],
)
def test_the_form_changes_at_its_tag(first: tuple[int, ...], last: tuple[int, ...], next_: tuple[int, ...]) -> None:
    """A form holds from its first tag to its last and changes at the next: paired -> quadratic at v2.22.3-1, the
    reversed part -> the reversed base at v2.28.3-1, quadratic -> grouped at v2.28.7-1, one node one group at
    v2.28.9-1 (the probes: 2 nodes of 8, one node's channels, one node of 16)."""
    assert all(p(first) == p(last) for p in PROBES)
    assert any(p(last) != p(next_) for p in PROBES)


@pytest.mark.parametrize(("minor", "newest"), [((2, 21), (2, 21, 5)), ((2, 27), (2, 27, 7)), ((2, 28), (2, 28, 9))])
def test_a_bare_minor_runs_its_newest_patch(minor: tuple[int, ...], newest: tuple[int, ...]) -> None:
    assert all(p(minor) == p(newest) for p in PROBES)
    assert all(p((*minor, 0)) == p(newest) for p in PROBES)


@pytest.mark.parametrize(("version", "channel"), [("2.21.5", 8), ("2.27.3", 1), ("2.28.3", 8), ("2.29.7", 8)])
def test_the_runs_nccl_version_sets_a_grouped_sends_channel(version: str, channel: int) -> None:
    """A send 3 -> 11 (128 KiB: one part) on 2 DGX A100 hosts' 16-rank communicator (16 p2p channels, 4 bits):
    node delta 1, step 0. 2.21: the peer's base 1, mirrored: 8. 2.27: round 8's base 1, not reversed: 1. 2.28.3+:
    reverse(1) = 8. The flow's key carries its channel in its top 16 bits."""
    env = nccl_env({"PHANTORA_NCCL_VERSION": version})
    coll = Collective("send_recv", (3, 11), 128 * 1024, "bf16", None, tuple(range(16)))
    dag = decompose(coll, a100_hosts(2), AlgoOptions(nccl_env=env))
    assert {f.key >> 48 for f in dag.flows} == {channel}


# NCCL_P2P_SCHEDULE_GROUP_SIZE (init.cc `NCCL_PARAM(GroupSize, "P2P_SCHEDULE_GROUP_SIZE", 8)`, read by
# `ncclP2pSchedule` from v2.28.7-1): groupSize = the variable across nodes (v2.28.9-1 on: maxLocalRanks on one
# node), cut to gcd(groupSize, localRanks) for each node it does not divide or exceeds; then local = localRank %
# groupSize, group deltas (x*x + x)/2 mod pow2Up(nRanks / groupSize), local deltas 0 .. groupSize-1 in turn, and
# round k's base (k / groupSize) * divUp(groupSize, 8) + (k % groupSize) / 8, bit-reversed (channel.h).
# Rank 11 of 2 nodes of 8 in groups of 4: groups {0-3}, {4-7}, {8-11}, {12-15}; its group 2, local 3; group deltas
# mod 4: 0 1 3 2 -> groups 2, 3, 1, 0, each from local 3 upward.
GROUP4_RANK11 = (11, 8, 9, 10, 15, 12, 13, 14, 7, 4, 5, 6, 3, 0, 1, 2)
# groups of 1 (gcd(3, 8)): init.cc's own example order for 16, from rank 11
SINGLES_RANK11 = tuple((11 + d) % 16 for d in SIXTEEN_QUADRATIC)


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (4, GROUP4_RANK11),
        (12, GROUP4_RANK11),  # 8 % 12 != 0: gcd(12, 8) = 4
        (3, SINGLES_RANK11),  # gcd(3, 8) = 1
        (16, (11, 12, 13, 14, 15, 8, 9, 10, 3, 4, 5, 6, 7, 0, 1, 2)),  # 8 < 16: gcd = 8, the default's
    ],
)
def test_a_schedule_group_size_regroups_the_rounds_across_nodes(group: int, expected: tuple[int, ...]) -> None:
    assert send_rounds(_nodes(2, 8), 11, GROUPED, group) == expected
    assert send_rounds(_nodes(2, 8), 11, (2, 28, 7), group) == expected


def test_one_node_reads_the_group_size_only_in_2_28_7() -> None:
    """One node of 8, rank 3, groups of 4: v2.28.7-1 cuts it into {0-3}, {4-7} (group deltas 0, 1); from
    v2.28.9-1 one node is one group of maxLocalRanks, whatever the variable says."""
    assert send_rounds(_nodes(1, 8), 3, (2, 28, 7), 4) == (3, 0, 1, 2, 7, 4, 5, 6)
    assert send_rounds(_nodes(1, 8), 3, GROUPED, 4) == LINEAR3


@pytest.mark.parametrize("v", [PAIRED, QUADRATIC, (2, 28, 3)])
def test_forms_before_2_28_7_have_no_group_size(v: tuple[int, ...]) -> None:
    assert send_rounds(_nodes(2, 8), 11, v, 4) == send_rounds(_nodes(2, 8), 11, v)


@pytest.mark.parametrize(
    ("nodes", "dst", "group", "expected"),
    [
        (_nodes(2, 8), 12, 4, [8, 9]),  # 3 -> 12 in round 9 (group 3 after 0, 1): base 9 / 4 = 2, reversed: 8
        (_nodes(2, 8), 12, 8, [16, 17]),  # the default: round 9, base 1, reversed: 16
        (_nodes(2, 16), 21, 16, [8, 9]),  # round 16 + 2: base (18 / 16) x divUp(16, 8) + 2 / 8 = 2 -> 8
        (_nodes(2, 16), 29, 16, [24, 25]),  # round 16 + 10: base 2 + 10 / 8 = 3 -> 24
        (_nodes(2, 16), 21, 8, [24, 25]),  # groups of 8: 21 is in group 2, reached in rounds 24 .. 31: base 3
    ],
)
def test_a_rounds_channel_follows_the_group_size(
    nodes: tuple[int, ...], dst: int, group: int, expected: list[int]
) -> None:
    """32 p2p channels (5 bits), 2 parts from rank 3 (NCCL 2.29.7)."""
    assert transfer_channel_ids(nodes, 3, dst, 2, 32, GROUPED, group) == expected


@pytest.mark.parametrize(("group", "channel"), [(None, 8), ("4", 12), ("16", 8), ("0x4", 12)])
def test_the_variable_sets_a_sends_channel_in_the_flows(group: str | None, channel: int) -> None:
    """A send 3 -> 11 (128 KiB: one part) on 2 DGX A100 hosts' 16-rank communicator (16 p2p channels, 4 bits),
    NCCL 2.29.7: groups of 8 reach 11 in round 8 (base 1, reversed: 8); groups of 4 in round 12 (base 3, reversed:
    12); 16 exceeds a node's 8 ranks, so gcd(16, 8) = 8. NCCL reads the value with strtoll(.., 0): 0x4 is 4. The
    flows both engines run carry the channel in their key's top 16 bits."""
    pairs = {"PHANTORA_NCCL_VERSION": "2.29.7"} | ({"NCCL_P2P_SCHEDULE_GROUP_SIZE": group} if group else {})
    coll = Collective("send_recv", (3, 11), 128 * 1024, "bf16", None, tuple(range(16)))
    dag = decompose(coll, a100_hosts(2), AlgoOptions(nccl_env=nccl_env(pairs)))
    assert {f.key >> 48 for f in dag.flows} == {channel}


@pytest.mark.parametrize("bad", ["0", "-4", "eight", "2147483648"])
def test_a_bad_group_size_is_refused_naming_the_variable(bad: str) -> None:
    """0 divides by zero in ncclP2pSchedule, a negative group indexes ranks by negative remainders, a word is
    strtoll's 0, and beyond an int it wraps: each is one error naming the variable."""
    with pytest.raises(InputError, match=f"NCCL_P2P_SCHEDULE_GROUP_SIZE={bad!r}"):
        settings_of((("NCCL_P2P_SCHEDULE_GROUP_SIZE", bad),))


def test_the_group_size_is_honoured_and_recorded_with_the_others() -> None:
    """Unset: NCCL's 8; set: the run's NCCL_* record (results.json `nccl.env`) holds it."""
    assert settings_of(()).p2p_sched_group == 8
    assert settings_of((("NCCL_P2P_SCHEDULE_GROUP_SIZE", "4"),)).p2p_sched_group == 4
    env = nccl_env({"NCCL_P2P_SCHEDULE_GROUP_SIZE": "4", "UNRELATED": "1"})
    assert env == (("NCCL_P2P_SCHEDULE_GROUP_SIZE", "4"),)
    assert summarize_choices([], env)["env"] == {"NCCL_P2P_SCHEDULE_GROUP_SIZE": "4"}
