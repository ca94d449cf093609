"""A collective that NCCL's model refuses (a bad NCCL_* variable) fails in one short line that leads with the
reason: no "missing []" when every member issued it, and no list of every rank of a large group."""

from __future__ import annotations

import pytest

from bridge.core import CoordinatorCore
from bridge.errors import RunFailed
from bridge.matching import Call, Rendezvous, describe_key, ranks_list
from bridge.protocol import decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine


def _call(rank: int) -> Call:
    return Call(rank=rank, handle=1, kind="all_reduce", nbytes=65536, dtype="fp32", root=None, t=0)


def test_ranks_list_keeps_short_lists_and_cuts_long_ones() -> None:
    assert ranks_list([2]) == "[2]"
    assert ranks_list(range(16)) == str(list(range(16)))
    assert ranks_list(range(1024)) == "[0, 1, 2, 3, 4, 5, 6, 7, ..., 1023] (1024 ranks)"


def test_complete_rendezvous_says_all_members_issued() -> None:
    group = tuple(range(1024))
    rv = Rendezvous(("coll", group, 0), group, {r: _call(r) for r in group})
    text = rv.describe()
    assert "missing" not in text and "issued by all 1024 ranks" in text
    assert len(text) < 200, text
    assert describe_key(("coll", group, 3)) == "group [0, 1, 2, 3, 4, 5, 6, 7, ..., 1023] (1024 ranks) seq 3"


def test_incomplete_rendezvous_names_the_missing() -> None:
    rv = Rendezvous(("coll", (0, 1, 2), 0), (0, 1, 2), {0: _call(0), 1: _call(1)})
    assert "issued by ranks [0, 1], missing [2]" in rv.describe()


def test_a_bad_nccl_variable_fails_in_a_line_that_leads_with_it() -> None:
    """NCCL_ALGO=Foo: the coordinator's plan of the first collective fails; its line starts with the variable's
    own error, then says which call it was."""
    world = 4
    topo = leaf_spine(1, world, 0, nic_rate="100Gbps", latency="1us")
    core = CoordinatorCore(
        FlowSimulator(topo), topo, world, window_ns=0, algo=AlgoOptions(nccl_env=(("NCCL_ALGO", "Foo"),)),
        send=lambda r, raw: None,
    )  # fmt: skip
    with pytest.raises(RunFailed) as err:
        for r in range(world):
            core.on_message(r, decode(encode("coll", 0, h=1, group=list(range(world)), seq=0, kind="all_reduce",
                                             nbytes=65536, dtype="fp32", root=None, name="", algo=None)))  # fmt: skip
            core.on_message(r, decode(encode("wait", 0, handles=[1], until=2**62)))
        core.progress()
    text = err.value.text
    assert text.split(":")[0].strip() in ("field 'NCCL_ALGO'", "NCCL_ALGO='Foo'"), text
    assert "unknown name 'Foo'" in text and "issued by all 4 ranks" in text and "missing" not in text
    assert "\n" not in text


def test_a_transfer_is_described_in_bytes_without_a_dtype() -> None:
    """The p2p wire carries no dtype (the coordinator files a transfer as uint8): a send reads as its bytes, not as
    a uint8 send of a program that sent floats."""
    send = Call(rank=1, handle=1, kind="send", nbytes=1 << 20, dtype="uint8", root=None, t=0, name="send#0")
    assert send.describe() == "rank 1 called send 'send#0'(1048576 B) at 0 ns"
    assert "fp32" in _call(0).describe()
