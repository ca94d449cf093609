"""The coordinator's logic (no sockets): rendezvous, exact and window clocks, diagnostics.

Times are checked against closed forms on a 4-GPU star of 100 Gb/s, 1 us links: a ring
all-reduce of S bytes on n ranks takes 2(n-1)/n * S * 8 / B plus two link latencies (one hop
through the switch) in the flow engine, and a send of S bytes takes S * 8 / B plus the same. These are the ideal
model's closed forms (`IDEAL`: line rate, no NCCL latency); under the NCCL model, the default, a collective the
coordinator starts at t takes exactly what the same flows take alone from 0 (the NCCL model's own closed forms
are in tests/test_nccl_model.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import DONE, RUN, WAIT, CoordinatorCore
from bridge.errors import RunFailed
from bridge.protocol import INF_NS, Message, decode, encode
from phantora.collectives import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

B = 100 * 10**9
LAT = 1000
S = 8 * 2**20
IDEAL = AlgoOptions(model="ideal")


def ring_allreduce_ns(nbytes: int, n: int) -> int:
    return -(-2 * (n - 1) * nbytes * 8 * 10**9 // (n * B)) + 2 * LAT


def transfer_ns(nbytes: int) -> int:
    return -(-nbytes * 8 * 10**9 // B) + 2 * LAT


def alone_ns(topo: Any, coll: Collective, algo: AlgoOptions) -> int:
    """How long `coll` takes on the idle flow engine, decomposed directly (not through the coordinator)."""
    sim = FlowSimulator(topo)
    sim.submit(decompose(coll, topo, algo).flows, at=0)
    return max(c.end_ns for c in sim.drain())


class Harness:
    """A CoordinatorCore on the flow engine, with the replies it sent kept per rank."""

    def __init__(self, world: int = 4, window_ns: int = 0, algo: AlgoOptions | None = None) -> None:
        self.topo = leaf_spine(1, 4, 0, nic_rate="100Gbps", latency="1us")
        self.sent: dict[int, list[Message]] = {r: [] for r in range(world)}
        self.core = CoordinatorCore(
            FlowSimulator(self.topo),
            self.topo,
            world,
            window_ns=window_ns,
            algo=AlgoOptions() if algo is None else algo,
            send=lambda r, raw: self.sent[r].append(decode(raw)),
        )
        self.handles = dict.fromkeys(range(world), 0)

    def msg(self, rank: int, type_: str, t: int, **fields: Any) -> None:
        self.core.on_message(rank, decode(encode(type_, t, **fields)))

    def coll(self, rank: int, t: int, kind: str = "all_reduce", nbytes: int = S, group=(0, 1, 2, 3), seq: int = 0):
        self.handles[rank] += 1
        h = self.handles[rank]
        self.msg(rank, "coll", t, h=h, group=list(group), seq=seq, kind=kind, nbytes=nbytes, dtype="bf16", root=None,
                 name="", algo=None)  # fmt: skip
        return h

    def wait(self, rank: int, t: int, *handles: int, until: int = INF_NS) -> None:
        self.msg(rank, "wait", t, handles=list(handles), until=until)

    def result(self, rank: int) -> Message:
        got = [m for m in self.sent[rank] if m.type == "result"]
        assert got, f"rank {rank} got no result"
        return got[-1]


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_allreduce_starts_at_latest_issue_and_ends_at_closed_form(model: str) -> None:
    """Ideal model: the ring's closed form after the latest issue; NCCL model: the time of the same collective
    decomposed and run alone, after the latest issue."""
    algo = AlgoOptions(model=model)
    h = Harness(algo=algo)
    issue = {0: 0, 1: 5_000, 2: 20_000, 3: 7_000}
    hs = {r: h.coll(r, t) for r, t in issue.items()}
    for r, t in issue.items():
        h.wait(r, t, hs[r])
    h.core.progress()
    if model == "ideal":
        took = ring_allreduce_ns(S, 4)
    else:
        took = alone_ns(h.topo, Collective("all_reduce", (0, 1, 2, 3), S, "bf16"), algo)
        assert took != ring_allreduce_ns(S, 4)  # NCCL's latency and throughput, not the line rate
    want = max(issue.values()) + took
    for r in range(4):
        res = h.result(r)
        assert res["h"] == hs[r]
        assert res["t_done"] == want
        assert h.core.ranks[r].state == RUN and h.core.ranks[r].promise == want
    rec = h.core.records[0]
    assert rec.t_start == rec.t_requested == 20_000 and rec.end_ns == want


def test_exact_mode_moves_only_once_every_rank_is_blocked() -> None:
    """Rank 0 waits; rank 1 is still computing (its clock far ahead): nothing is launched and the network stays
    put until rank 1 blocks too; then one advance, which stops at the completion both wait on (ideal model: the
    ring's closed form), not at rank 1's far clock."""
    h = Harness(world=2, algo=IDEAL)
    a = h.coll(0, 0, group=(0, 1))
    b = h.coll(1, 0, group=(0, 1))
    h.wait(0, 0, a)
    h.msg(1, "clock", 10**9, block=False)
    h.core.progress()
    assert h.core.engine.now() == 0 and h.core.rounds == 0 and not h.core.records
    assert h.core.ranks[0].state == WAIT and not h.sent[1]
    h.wait(1, 10**9, b)
    h.core.progress()
    want = ring_allreduce_ns(S, 2)
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == want
    assert h.core.engine.now() == want and h.core.rounds == 1


def test_wait_with_deadline_returns_none_before_completion() -> None:
    h = Harness(world=2)
    a = h.coll(0, 0, kind="all_gather", group=(0, 1))
    h.coll(1, 0, kind="all_gather", group=(0, 1))
    h.msg(1, "finish", 0, results={}, cpu_s=0.0)
    h.wait(0, 0, a, until=50_000)
    h.core.progress()
    res = h.result(0)
    assert res["h"] is None and res["t_done"] is None
    assert h.core.ranks[0].promise == 50_000
    assert h.core.engine.now() == 50_000


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_send_recv_completes_on_both_sides_at_transfer_time(model: str) -> None:
    """Ideal model: the line-rate transfer time after the later side; NCCL model: the send/recv decomposed and
    run alone, after the later side."""
    algo = AlgoOptions(model=model)
    h = Harness(world=2, algo=algo)
    h.msg(0, "p2p", 3_000, h=1, peer=1, send=True, tag=7, seq=0, nbytes=S, name="")
    h.msg(1, "p2p", 9_000, h=1, peer=0, send=False, tag=7, seq=0, nbytes=S, name="")
    h.wait(0, 3_000, 1)
    h.wait(1, 9_000, 1)
    h.core.progress()
    if model == "ideal":
        took = transfer_ns(S)
    else:
        took = alone_ns(h.topo, Collective("send_recv", (0, 1), S, "bf16"), algo)
        assert took != transfer_ns(S)
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == 9_000 + took


def test_window_mode_rounds_are_whole_windows_and_late_start_is_bounded() -> None:
    """Ideal model: the completion at the ring's closed form."""
    w = 100_000
    h = Harness(world=2, window_ns=w, algo=IDEAL)
    a = h.coll(0, 0, group=(0, 1))
    b = h.coll(1, 0, group=(0, 1))
    h.wait(0, 0, a)
    h.wait(1, 0, b)
    h.core.progress()
    done = ring_allreduce_ns(S, 2)
    # Network time is a window boundary: the end of the window holding the completion.
    assert h.core.engine.now() % w == 0
    assert done <= h.core.engine.now() < done + w
    assert h.result(0)["t_done"] == done
    assert h.result(0)["lease"] == h.core.engine.now() + w
    # A follow-up issued right at the completion starts late, by less than one window. It is launched once both
    # ranks are blocked (nothing else can arrive first: the launch order does not depend on arrival), at the
    # network's time then, which has not moved since.
    now = h.core.engine.now()
    a2 = h.coll(0, done, seq=1, group=(0, 1))
    b2 = h.coll(1, done, seq=1, group=(0, 1))
    assert len(h.core.records) == 1
    h.wait(0, done, a2)
    h.wait(1, done, b2)
    h.core.progress()
    rec = h.core.records[1]
    assert rec.t_start == now and 0 < rec.t_start - rec.t_requested < w


def test_window_barrier_holds_until_every_rank_reaches_the_window_end() -> None:
    w = 10_000
    h = Harness(world=2, window_ns=w)
    h.msg(0, "clock", 3 * w + 5, block=True)
    h.core.progress()
    assert not h.sent[0] and h.core.engine.now() == 0  # rank 1 is still at 0
    h.msg(1, "clock", w, block=True)
    h.core.progress()
    assert h.result(1)["now"] == w and not h.sent[0]
    h.msg(1, "clock", 4 * w, block=True)
    h.core.progress()
    assert h.result(0)["now"] == 3 * w and h.result(0)["lease"] == 4 * w


def test_mismatch_names_both_ranks_and_calls() -> None:
    h = Harness(world=2)
    h.coll(0, 0, kind="all_reduce", group=(0, 1))
    with pytest.raises(RunFailed) as err:
        h.coll(1, 0, kind="all_gather", group=(0, 1))
    text = err.value.text
    assert err.value.code == "mismatch"
    assert "rank 0 called all_reduce" in text and "rank 1 called all_gather" in text and "kind" in text


def test_size_mismatch_is_reported() -> None:
    h = Harness(world=2)
    h.coll(0, 0, nbytes=1024, group=(0, 1))
    with pytest.raises(RunFailed, match="size"):
        h.coll(1, 0, nbytes=2048, group=(0, 1))


def test_missing_participant_on_finish() -> None:
    h = Harness(world=3)
    h.coll(0, 0, group=(0, 1, 2))
    h.coll(1, 0, group=(0, 1, 2))
    with pytest.raises(RunFailed) as err:
        h.msg(2, "finish", 10, results={}, cpu_s=0.0)
    assert "missing participant" in err.value.text and "rank 2 finished" in err.value.text
    assert "missing [2]" in err.value.text


def test_deadlock_reports_who_waits_on_what() -> None:
    h = Harness(world=2)
    a = h.coll(0, 0, group=(0, 1), seq=0)
    b = h.coll(1, 0, group=(0, 1), seq=1)  # rank 1 skipped seq 0
    h.wait(0, 0, a)
    h.wait(1, 0, b)
    with pytest.raises(RunFailed) as err:
        h.core.progress()
    text = err.value.text
    assert err.value.code == "deadlock"
    assert "rank 0 waits on" in text and "seq 0" in text and "not issued by rank 1" in text
    assert "rank 1 waits on" in text and "seq 1" in text


def test_clock_going_back_is_rejected() -> None:
    h = Harness(world=2)
    h.msg(0, "clock", 5_000, block=False)
    with pytest.raises(RunFailed, match="never goes back"):
        h.coll(0, 4_000, group=(0, 1))


def test_finalize_drains_and_records_everything() -> None:
    """Ideal model: the record's end at the ring's closed form."""
    h = Harness(world=2, algo=IDEAL)
    h.coll(0, 0, group=(0, 1))
    h.coll(1, 0, group=(0, 1))
    h.msg(0, "finish", 0, results={"a": 1}, cpu_s=0.0)
    h.msg(1, "finish", 0, results={"b": 2}, cpu_s=0.0)
    assert all(rs.state == DONE for rs in h.core.ranks) and h.core.all_finished()
    out = h.core.finalize()
    rec = out["collectives"][0]
    assert rec["end_ns"] == ring_allreduce_ns(S, 2)
    assert len(out["completions"]) == rec["flows"] > 0
    assert out["ranks"] == [[0, {"a": 1}, 0], [1, {"b": 2}, 0]]


def test_per_flow_records_are_dropped_whole_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_KEPT_FLOWS the outcome carries no per-flow records (not a biased first part), and says
    why; the collective records and the engine's totals still count every flow."""
    import bridge.core

    def run(cap: int) -> dict[str, Any]:
        monkeypatch.setattr(bridge.core, "MAX_KEPT_FLOWS", cap)
        h = Harness(world=2)
        for seq in range(2):
            for r in (0, 1):
                h.coll(r, 0, group=(0, 1), seq=seq)
        for r in (0, 1):
            h.msg(r, "finish", 0, results={}, cpu_s=0.0)
        return h.core.finalize()

    flows = sum(rec["flows"] for rec in run(10**6)["collectives"])
    kept = run(flows)
    assert len(kept["completions"]) == flows and kept["flows_note"] == ""
    dropped = run(flows - 1)
    assert dropped["completions"] == [] and f"more than {flows - 1:,} flows" in dropped["flows_note"]
    assert sum(rec["flows"] for rec in dropped["collectives"]) == flows
    assert dropped["engine_stats"]["flows_completed"] == flows


def test_missing_participant_that_finished_before_the_call() -> None:
    h = Harness(world=3)
    h.msg(2, "finish", 0, results={}, cpu_s=0.0)
    with pytest.raises(RunFailed, match=r"missing participant: rank 2 finished at 0 ns .* missing \[1, 2\]"):
        h.coll(0, 0, group=(0, 1, 2))


def test_earliest_bound_of_the_watched_flows_is_their_least_bound() -> None:
    """The coordinator keeps, per record and rank, a heap of its pending flows' bounds (`_least`), and the watched
    set between steps less the flows that completed; at every step of two chunked all-reduces (NCCL steps as
    flows, completing over many advances) the set equals the definition (the waiting ranks' pending flows) and the
    earliest the least bound among them."""
    algo = AlgoOptions(model="ideal", granularity="chunked")
    h = Harness(algo=algo)
    core = h.core
    seen: list[tuple[int, int]] = []
    inner = core.watched_earliest

    sets: list[set[int]] = []

    def checked() -> tuple[set[int], int]:
        watch, earliest = inner()
        fresh: set[int] = set()  # the definition: every waiting rank's pending flows of the calls it waits on
        for rs in core.waiting.values():
            for hd in rs.handles:
                cid = rs.owner.get(hd)
                if cid is not None and hd not in rs.results:
                    fresh |= core.records[cid].pending.get(rs.rank, set())
        assert watch == fresh
        sets.append(watch)
        want = min((core.bounds.bounds[f] for f in fresh), default=INF_NS)
        seen.append((earliest, want))
        return watch, earliest

    core.watched_earliest = checked  # type: ignore[method-assign]
    hs = {r: h.coll(r, 0) for r in range(4)}
    h2 = {r: h.coll(r, 0, nbytes=S // 2, seq=1) for r in range(4)}
    for r in range(4):
        h.wait(r, 0, hs[r], h2[r])
    core.progress()
    assert len(seen) > 1 and all(got == want for got, want in seen)
    assert len({e for e, _ in seen}) > 1  # the least moves as flows complete
    assert any(a is b for a, b in zip(sets[:-1], sets[1:], strict=True))  # a set kept between steps
    ends = {h.result(r)["t_done"] for r in range(4)}
    assert len(ends) == 1 and ends.pop() >= ring_allreduce_ns(S // 2, 4)  # no flow beats its bound
