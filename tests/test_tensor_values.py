"""Small integer tensors carry their values through collectives in phantom mode (phantora/runtime/tensor_values.py).

On a GPU a broadcast or a recv overwrites the receiver's values, and an all-reduce leaves the reduction on every
rank. The fast tests run both sides of each collective in this process over one value board (bridge.values), as
two ranks would; the slow one runs 2 phantom ranks and also compares each collective's time in the trace with the
same collective of a phantom float tensor of the same bytes (no values): the values add no time.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from bridge.values import ValueBoard
from phantora.collectives.mirrors import Mirrors
from phantora.runtime import session as _session
from phantora.runtime import tensor_values as tv
from phantora.runtime.simcuda.tensor import SimCudaTensor

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "phantom_tensor_values.py"


class Rank:
    """One rank's client of the shared board, with its own key sequence (each rank process has one)."""

    def __init__(self, board: ValueBoard, rank: int) -> None:
        self.board, self.rank = board, rank
        self.keys: dict[tuple[int, ...], int] = {}

    def post_value(self, *, group: Any, key: int, data: bytes, reads: bool = True) -> None:
        self.board.post(self.rank, list(group), key, data, reads)

    def take_values(self, *, group: Any, key: int) -> list[bytes | None]:
        return self.board.take(self.rank, list(group), key)


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Rank]]:
    """Two ranks over one board; `as_rank(monkeypatch, r)` makes rank r the caller."""
    board = ValueBoard(Mirrors(2, 2))
    yield [Rank(board, 0), Rank(board, 1)]


def as_rank(monkeypatch: pytest.MonkeyPatch, r: Rank) -> None:
    monkeypatch.setattr(tv, "_client", lambda: r)
    monkeypatch.setattr(tv, "_keys", r.keys)


def test_a_broadcast_writes_the_roots_values_over_the_receivers_own(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    root_state, own_state = torch.arange(16, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)
    as_rank(monkeypatch, ranks[0])
    assert tv.broadcast((0, 1), 0, 0, [root_state]) is None
    as_rank(monkeypatch, ranks[1])
    finish = tv.broadcast((0, 1), 1, 0, [own_state])
    assert finish is not None
    finish()
    assert own_state.tolist() == list(range(16))


def test_a_phantom_receiver_on_the_device_gets_the_sent_values_as_its_data(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torch.zeros(5, device="cuda")` in phantom mode is meta: after the recv it holds the sender's values."""
    as_rank(monkeypatch, ranks[0])
    tv.send(0, 1, [torch.tensor([3, 1, 4, 1, 5])])
    as_rank(monkeypatch, ranks[1])
    buffer = SimCudaTensor(torch.empty(5, dtype=torch.int64, device="meta"), 0)
    tv.recv(0, 1, tv.targets([buffer]))()
    assert not buffer.elem.is_meta and buffer.elem.tolist() == [3, 1, 4, 1, 5]


def test_a_phantom_sender_leaves_the_receiver_as_it_was(ranks: list[Rank], monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, ranks[0])
    tv.send(0, 1, [torch.empty(3, dtype=torch.int64, device="meta")])
    as_rank(monkeypatch, ranks[1])
    mine = torch.tensor([7, 8, 9])
    tv.recv(0, 1, [mine])()
    assert mine.tolist() == [7, 8, 9]


def test_a_recv_takes_the_send_of_its_own_tag(ranks: list[Rank], monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 sends [1] with tag 1, then [2] with tag 2; rank 1 receives tag 2 first: it gets [2], as the simulator
    (and NCCL / gloo) match a recv with the send of its tag, then [1]."""
    as_rank(monkeypatch, ranks[0])
    tv.send(0, 1, [torch.tensor([1])], tag=1)
    tv.send(0, 1, [torch.tensor([2])], tag=2)
    as_rank(monkeypatch, ranks[1])
    second, first = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    tv.recv(0, 1, [second], tag=2)()
    tv.recv(0, 1, [first], tag=1)()
    assert (second.tolist(), first.tolist()) == ([2], [1])


def test_a_send_and_a_collective_of_the_same_two_ranks_do_not_mix(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 sends [5] to rank 1, then broadcasts [7] on the group (0, 1) (another communicator); rank 1 joins the
    broadcast first, then receives: [7] from the broadcast, [5] from the recv."""
    as_rank(monkeypatch, ranks[0])
    tv.send(0, 1, [torch.tensor([5])])
    tv.broadcast((0, 1), 0, 0, [torch.tensor([7])])
    as_rank(monkeypatch, ranks[1])
    got_bcast, got_recv = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    finish = tv.broadcast((0, 1), 1, 0, [got_bcast])
    assert finish is not None
    finish()
    tv.recv(0, 1, [got_recv])()
    assert (got_bcast.tolist(), got_recv.tolist()) == ([7], [5])


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (dist.ReduceOp.SUM, [5, 50]),
        (dist.ReduceOp.MAX, [3, 30]),
        (dist.ReduceOp.MIN, [2, 20]),
        (dist.ReduceOp.PRODUCT, [6, 600]),
        (dist.ReduceOp.AVG, [2, 25]),
    ],
)
def test_an_all_reduce_leaves_the_reduction_on_every_rank(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch, op: Any, expected: list[int]
) -> None:
    """Ranks hold [2, 20] and [3, 30]; AVG of integers is the floor of the mean, as real mode's gloo sum / n."""
    held = [torch.tensor([2, 20]), torch.tensor([3, 30])]
    finishes = []
    for r, t in zip(ranks, held, strict=True):
        as_rank(monkeypatch, r)
        finishes.append((r, tv.all_reduce((0, 1), [t], op)))
    for r, finish in finishes:
        as_rank(monkeypatch, r)
        finish()
    assert [t.tolist() for t in held] == [expected, expected]


def test_an_all_reduce_wraps_at_the_tensors_width(ranks: list[Rank], monkeypatch: pytest.MonkeyPatch) -> None:
    """uint8 200 + 100 is 300 mod 256 = 44 on every rank (NCCL and gloo add in the tensor's dtype), not an error."""
    held = [torch.tensor([200], dtype=torch.uint8), torch.tensor([100], dtype=torch.uint8)]
    finishes = []
    for r, t in zip(ranks, held, strict=True):
        as_rank(monkeypatch, r)
        finishes.append((r, tv.all_reduce((0, 1), [t], dist.ReduceOp.SUM)))
    for r, finish in finishes:
        as_rank(monkeypatch, r)
        finish()
    assert [t.tolist() for t in held] == [[44], [44]]


def test_an_all_gather_concatenates_in_rank_order(ranks: list[Rank], monkeypatch: pytest.MonkeyPatch) -> None:
    outs = [torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)]
    finishes = []
    for r, out in zip(ranks, outs, strict=True):
        as_rank(monkeypatch, r)
        finishes.append((r, tv.all_gather((0, 1), [torch.tensor([r.rank, 7 * r.rank], dtype=torch.int32)], [out])))
    for r, finish in finishes:
        as_rank(monkeypatch, r)
        finish()
    assert [o.tolist() for o in outs] == [[0, 0, 1, 7]] * 2


def test_an_all_gather_carries_a_routing_map_over_the_old_4_kib_limit(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Megatron's all-gather dispatcher gathers each rank's boolean routing map (tokens x experts) over the EP group
    and sizes its permutation from it: 4096 tokens x 64 experts, 256 KiB a rank (a 4 KiB limit stopped at 4 KiB in
    all). Each rank's map has token r's two choices at experts (2 r + rank) mod 64 and (2 r + 1 + rank) mod 64; the
    output is rank 0's then rank 1's, and each expert's count is the closed form 2 x 4096 x 2 / 64 = 256."""
    tokens, experts = 4096, 64
    rows = torch.arange(tokens)
    maps = []
    for rank in (0, 1):
        m = torch.zeros(tokens, experts, dtype=torch.bool)
        m[rows, (2 * rows + rank) % experts] = True
        m[rows, (2 * rows + 1 + rank) % experts] = True
        maps.append(m)
    monkeypatch.setattr(_session, "current", lambda: SimpleNamespace(phantom=True))
    outs = [torch.zeros(2 * tokens, experts, dtype=torch.bool) for _ in (0, 1)]
    assert tv.carried([outs[0], maps[0]]) and 3 * tokens * experts > 4096
    finishes = []
    for r, out in zip(ranks, outs, strict=True):
        as_rank(monkeypatch, r)
        finishes.append((r, tv.all_gather((0, 1), [maps[r.rank]], [out])))
    for r, finish in finishes:
        as_rank(monkeypatch, r)
        finish()
    for out in outs:
        assert torch.equal(out, torch.cat(maps))
        assert out.sum(dim=0).tolist() == [2 * tokens * 2 // experts] * experts


def _all_to_all(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch, parts: list[list[torch.Tensor]], outs: list
) -> None:
    group = tuple(r.rank for r in ranks)
    finishes = []
    for r, mine, out in zip(ranks, parts, outs, strict=True):
        as_rank(monkeypatch, r)
        finishes.append((r, tv.all_to_all(group, r.rank, mine, out)))
    for r, finish in finishes:
        as_rank(monkeypatch, r)
        finish()


def test_an_all_to_all_leaves_each_members_part_of_every_member_in_rank_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 ranks, `all_to_all_single` of a (3, 2) tensor: rank i's row j is [10 i + j, -(10 i + j)] and goes to rank j,
    which holds rows from ranks 0, 1, 2 in that order (NCCL's all-to-all)."""
    board = ValueBoard(Mirrors(3, 3))
    ranks = [Rank(board, r) for r in range(3)]
    held = [torch.tensor([[10 * i + j, -(10 * i + j)] for j in range(3)]) for i in range(3)]
    outs = [[torch.empty(3, 2, dtype=torch.int64)] for _ in range(3)]
    _all_to_all(ranks, monkeypatch, [tv.split_rows(t, [1, 1, 1]) for t in held], outs)
    for j in range(3):
        assert outs[j][0].tolist() == [[10 * i + j, -(10 * i + j)] for i in range(3)]


def test_a_list_all_to_all_fills_one_output_per_member(ranks: list[Rank], monkeypatch: pytest.MonkeyPatch) -> None:
    """`dist.all_to_all(outputs, inputs)`: rank i's inputs[j] lands in rank j's outputs[i]."""
    inputs = [[torch.tensor([i, j, 7]) for j in (0, 1)] for i in (0, 1)]
    outs = [[torch.zeros(3, dtype=torch.int64) for _ in (0, 1)] for _ in (0, 1)]
    _all_to_all(ranks, monkeypatch, inputs, outs)
    assert [[o.tolist() for o in out] for out in outs] == [[[0, 0, 7], [1, 0, 7]], [[0, 1, 7], [1, 1, 7]]]


def test_an_uneven_all_to_all_fills_each_members_rows_and_keeps_the_keys_in_step(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splits rank 0 sees as even ([1, 1] out, [1, 1] in) and rank 1 as uneven ([1, 2] out, [1, 2] in): both post
    and take, so rank 0 gets [a0, b0] and rank 1 [a1, b1, b2], and the next collective of the group pairs up."""
    a, b = torch.tensor([10, 11]), torch.tensor([20, 21, 22])
    parts = [tv.split_rows(a, [1, 1]), tv.split_rows(b, [1, 2])]
    outs = [[torch.zeros(2, dtype=torch.int64)], [torch.zeros(3, dtype=torch.int64)]]
    _all_to_all(ranks, monkeypatch, parts, outs)
    assert [o[0].tolist() for o in outs] == [[10, 20], [11, 21, 22]]


def test_an_all_to_all_over_the_limit_posts_no_values_but_takes_its_key(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member whose part is over the limit posts none (the outputs stay as they were), yet the group's keys stay
    in step: the next all-to-all carries values again."""
    big = torch.arange(2 * (tv.LIMIT // 8 + 1))
    parts = [tv.split_rows(big, [big.numel() // 2] * 2), tv.split_rows(torch.arange(2), [1, 1])]
    outs = [[torch.full((big.numel() // 2 + 1,), 9)], [torch.full((big.numel() // 2 + 1,), 9)]]
    _all_to_all(ranks, monkeypatch, parts, outs)
    assert all(set(o[0].tolist()) == {9} for o in outs)
    parts = [tv.split_rows(torch.tensor([1, 2]), [1, 1]), tv.split_rows(torch.tensor([3, 4]), [1, 1])]
    outs = [[torch.zeros(2, dtype=torch.int64)], [torch.zeros(2, dtype=torch.int64)]]
    _all_to_all(ranks, monkeypatch, parts, outs)
    assert [o[0].tolist() for o in outs] == [[1, 3], [2, 4]]


def test_an_all_to_all_with_a_phantom_member_leaves_the_outputs_as_they_were(
    ranks: list[Rank], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts made on the device from phantom data (a router's choices) are phantom: nothing is invented."""
    phantom = torch.empty(2, dtype=torch.int64, device="meta")
    parts = [tv.split_rows(torch.tensor([1, 2]), [1, 1]), tv.split_rows(phantom, [1, 1])]
    outs = [[torch.full((2,), 9)], [torch.full((2,), 9)]]
    _all_to_all(ranks, monkeypatch, parts, outs)
    assert [o[0].tolist() for o in outs] == [[9, 9], [9, 9]]


def test_only_small_integer_tensors_in_phantom_mode_carry_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_session, "current", lambda: SimpleNamespace(phantom=True))
    assert tv.carried([torch.zeros(16, dtype=torch.uint8)])
    assert tv.carried([torch.zeros(tv.LIMIT // 8, dtype=torch.int64)])
    assert not tv.carried([torch.zeros(tv.LIMIT // 8 + 1, dtype=torch.int64)])  # a model's data is never sent twice
    assert not tv.carried([torch.zeros(4)])
    with tv.quiet():  # object collectives time their exchange with phantom tensors and post the values themselves
        assert not tv.carried([torch.zeros(16, dtype=torch.uint8)])
    monkeypatch.setattr(_session, "current", lambda: SimpleNamespace(phantom=False))
    assert not tv.carried([torch.zeros(16, dtype=torch.uint8)])  # real mode: gloo moves the data


def _durations(trace: Path, rank: int, kind: str) -> list[int]:
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [
        e["dur"]
        for e in events
        if e.get("pid") == rank and e.get("ph") == "X" and str(e.get("name", "")).startswith(f"{kind}#")
    ]


@pytest.mark.slow
def test_two_phantom_ranks_receive_the_sent_values_in_the_collectives_time(tmp_path: Path) -> None:
    """tests/scripts/phantom_tensor_values.py on 2 phantom ranks (about 20 s): rank 1 ends with rank 0's RNG
    state (seed 100, then its offset 0: 16 little-endian bytes), the values rank 0 sent, the all-reduce's maximum,
    the gathered values in rank order, each rank's row of every rank's counts after an all-to-all (the functional
    collective torchtitan's token dispatcher calls, and `dist.all_to_all_single`), and DTensor's RNG tracker adopts
    rank 0's seed (7) on both ranks, as on GPUs. The broadcast and the send of values take the time of the same
    collective of a phantom float tensor of the same bytes (16 B, 40 B)."""
    from phantora.launcher import RunConfig, launch

    out = tmp_path / "out"
    launch(RunConfig(str(SCRIPT), [str(tmp_path)], "testbed16", nproc=2, tensors="phantom", out_dir=out, timeout_s=300))
    seen = {r: json.loads((tmp_path / f"values{r}.json").read_text()) for r in (0, 1)}
    state = list((100).to_bytes(8, "little")) + [0] * 8
    for r in (0, 1):
        assert seen[r]["broadcast"] == state
        assert seen[r]["all_reduce_max"] == [2, 20]
        assert seen[r]["all_gather"] == [0, 0, 1, 7]
        assert seen[r]["dtensor_tracker"] is True and seen[r]["seed_after_tracker"] == 7
        # rank i's row r, from each rank i in rank order: [100 i + 10 r, 100 i + 10 r + 1]
        want = [[100 * i + 10 * r, 100 * i + 10 * r + 1] for i in (0, 1)]
        assert seen[r]["all_to_all_functional"] == seen[r]["all_to_all_single"] == want
    assert seen[1]["recv"] == [3, 1, 4, 1, 5]
    trace = out / "trace.json"
    broadcasts, sends = _durations(trace, 0, "broadcast"), _durations(trace, 0, "send")
    assert broadcasts[0] == broadcasts[-1] > 0 and sends[0] == sends[-1] > 0


class OrderClient:
    """A network client that records what a rank tells the coordinator, in order; each call completes at once."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.done: dict[int, int] = {}

    def _handle(self, what: str, t_issue_ns: int) -> int:
        self.said.append(what)
        self.done[len(self.done) + 1] = t_issue_ns
        return len(self.done)

    def collective(self, *, kind: str, t_issue_ns: int, **_: Any) -> int:
        return self._handle(f"issue {kind}", t_issue_ns)

    def p2p(self, *, is_send: bool, t_issue_ns: int, **_: Any) -> int:
        return self._handle("issue send" if is_send else "issue recv", t_issue_ns)

    def post_value(self, *, group: Any, key: int, data: bytes, reads: bool = True) -> None:
        self.said.append("post")

    def take_values(self, *, group: Any, key: int) -> list[bytes | None]:
        return [None] * len(group)

    def wait(self, handle: int) -> int:
        return self.done[handle]

    def test(self, handle: int, t_now_ns: int) -> int | None:
        return self.done[handle]

    def advance_clock(self, t_ns: int) -> None:
        pass


def test_each_value_is_posted_before_its_collective_is_issued(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's messages reach the coordinator in the order sent, so a value posted before its collective is issued
    is on the board before the collective can complete: a receiver that asks once it completes finds it. Rank 0 of
    a 2-rank phantom group, through the backend: every carried collective and the send post first."""
    from phantora.perfmodel.gpus import get_gpu
    from phantora.runtime.backend import PhantoraProcessGroup
    from phantora.runtime.compute import Roofline
    from phantora.runtime.session import RankSession

    client = OrderClient()
    s = RankSession(0, 2, client, Roofline(get_gpu("h100")), trace_level="none", phantom=True)
    monkeypatch.setattr(_session, "current", lambda: s)
    monkeypatch.setattr(_session, "require", lambda: s)
    monkeypatch.setattr(tv, "_keys", {})
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 2, datetime.timedelta(seconds=30), [0, 1], s)
    ints = torch.tensor([1, 2])
    pg.allreduce([ints]).wait()
    pg.broadcast([ints], 0).wait()
    pg.all_gather_single(torch.empty(4, dtype=torch.int64), ints).wait()
    pg.all_to_all_single(torch.empty(2, dtype=torch.int64), ints, [], []).wait()
    pg.all_to_all_single(torch.empty(2, dtype=torch.int64), ints, [1, 1], [1, 1]).wait()
    pg.alltoall([torch.empty(1, dtype=torch.int64)] * 2, [ints[:1], ints[1:]]).wait()
    # splits this rank sees as uneven (its peer may see its own as even): it posts all the same, as every member does
    pg.all_to_all_single(torch.empty(3, dtype=torch.int64), torch.tensor([1, 2, 3]), [1, 2], [1, 2]).wait()
    pg.send([ints], 1).wait()
    # an all-to-all given its parts (splits or lists, even or not) is one group of transfers on every member
    collectives = ["all_reduce", "broadcast", "all_gather", "all_to_all"]
    expected = [x for k in collectives for x in ("post", f"issue {k}")]
    expected += ["post", "issue send", "issue recv"] * 3  # even splits, equal lists, uneven splits: the same
    expected += ["post", "issue send"]
    assert client.said == expected
