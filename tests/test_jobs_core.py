"""Several jobs in one coordinator (no sockets): their own rank numbers, their flows contending, isolation.

Closed forms on a leaf-spine of 2 leaves x 2 GPUs and one spine, every link B = 100 Gb/s and 1 us, so a
leaf's uplink is shared 2:1. A 2-rank ring all-reduce of S bytes is one S-byte flow each way; across the
spine it crosses 4 links: alone it takes ceil(S*8/B) + 4 us; if another job's flow shares the uplink, max-min
gives each B/2: ceil(2*S*8/B) + 4 us. These closed forms are the ideal model's (`model="ideal"`: line rate, no NCCL
latency or rate caps); properties that hold under any model (isolation) are also checked under the NCCL model,
the default.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import DONE, CoordinatorCore
from bridge.errors import RunFailed
from bridge.jobs import JobInfo, JobTable
from bridge.protocol import INF_NS, Message, decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

B = 100 * 10**9
LAT = 1000
S = 8 * 2**20


def cross_ns(rate_bps: int) -> int:
    return -(-S * 8 * 10**9 // rate_bps) + 4 * LAT


class Spy(FlowSimulator):
    """The flow engine, keeping every flow submitted."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.submitted: list[Flow] = []

    def submit(self, flows: Any, at: int) -> None:
        self.submitted.extend(flows)
        super().submit(flows, at)


class Jobs:
    """A coordinator core running jobs of 2 ranks each on GPUs `gpus` (job j's ranks on gpus[2j], gpus[2j+1])."""

    def __init__(
        self,
        gpus: list[int],
        *,
        all_or_nothing: bool = False,
        priority: list[int | None] | None = None,
        model: str = "nccl",
    ):
        topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us").with_rank_order(gpus)
        n = len(gpus) // 2
        prio = priority or [None] * n
        self.table = JobTable([JobInfo(f"j{i}", 2 * i, 2, prio[i]).to_dict() for i in range(n)])
        self.sent: dict[int, list[Message]] = {r: [] for r in range(len(gpus))}
        self.engine = Spy(topo)
        self.core = CoordinatorCore(
            self.engine,
            topo,
            len(gpus),
            window_ns=0,
            algo=AlgoOptions(model=model),
            send=lambda r, raw: self.sent[r].append(decode(raw)),
            jobs=self.table,
            all_or_nothing=all_or_nothing,
        )
        self.failed: list[int] = []
        self.core.on_job_failed = lambda job, code, text: self.failed.append(job)

    def msg(self, g: int, type_: str, t: int, **fields: Any) -> None:
        self.core.on_message(g, decode(encode(type_, t, **fields)))

    def all_reduce(self, job: int, t: int = 0, group: tuple[int, ...] = (0, 1), nbytes: int = S) -> None:
        """Both ranks of `job` issue an all-reduce on their job-local `group` and wait for it."""
        for r in range(2):
            g = 2 * job + r
            self.msg(
                g,
                "coll",
                t,
                h=1,
                group=list(group),
                seq=0,
                kind="all_reduce",
                nbytes=nbytes,
                dtype="bf16",
                root=None,
                name=f"ar{job}",
                algo=None,
            )
            self.msg(g, "wait", t, handles=[1], until=INF_NS)

    def done(self, g: int) -> int:
        res = [m for m in self.sent[g] if m.type == "result"]
        assert res, f"rank {g} got no result"
        return int(res[-1]["t_done"])


def test_a_shared_uplink_halves_each_jobs_rate_as_max_min_predicts() -> None:
    """Ideal model (line rate), so that max-min's halving is the closed form."""
    alone = Jobs([0, 2], model="ideal")  # one job across the spine
    alone.all_reduce(0)
    alone.core.progress()
    assert alone.done(0) == alone.done(1) == cross_ns(B)
    shared = Jobs([0, 2, 1, 3], model="ideal")  # job 1 on the other GPU of each leaf: both cross the same uplinks
    shared.all_reduce(0)
    shared.all_reduce(1)
    shared.core.progress()
    for g in range(4):
        assert shared.done(g) == cross_ns(B // 2)
    # each job's flows used its own ECMP keys, counted from 0 as if it ran alone
    recs = [r.to_dict() for r in shared.core.records]
    assert [(r["job"], r["key0"], r["group"]) for r in recs] == [(0, 0, [0, 1]), (1, 0, [2, 3])]
    per_job = len(shared.engine.submitted) // 2
    assert [f.key for f in shared.engine.submitted] == [*range(per_job), *range(per_job)]


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_jobs_on_disjoint_leaves_run_exactly_as_alone(model: str) -> None:
    """Under either model, exactly as alone; under the ideal model, at the line-rate closed form."""
    both = Jobs([0, 1, 2, 3], model=model)  # job 0 on leaf 0, job 1 on leaf 1: no link in common
    both.all_reduce(0)
    both.all_reduce(1)
    both.core.progress()
    alone = Jobs([2, 3], model=model)
    alone.all_reduce(0)
    alone.core.progress()
    one_leaf = -(-S * 8 * 10**9 // B) + 2 * LAT
    if model == "nccl":
        one_leaf = alone.done(0)
        assert one_leaf != -(-S * 8 * 10**9 // B) + 2 * LAT  # NCCL's latency and throughput, not the line rate
    assert [both.done(g) for g in range(4)] == [one_leaf] * 4 == [alone.done(0)] * 2 + [alone.done(1)] * 2


def test_job_traffic_class_and_link_bytes_per_job() -> None:
    h = Jobs([0, 2, 1, 3], priority=[5, None])
    h.all_reduce(0)
    h.all_reduce(1)
    h.core.progress()
    per_job = len(h.engine.submitted) // 2
    assert [f.priority for f in h.engine.submitted] == [5] * per_job + [3] * per_job
    out = h.core.finalize()
    topo = h.core.topology  # nodes: GPUs 0-3, leaves 4-5, spine 6
    uplink = {ch for ch in range(topo.num_channels) if topo.channel_ends(ch) == (4, 6)}
    for job in out["jobs"]:
        per_ch = dict(job["channel_bytes"])
        assert sum(per_ch.values()) == 2 * 4 * S  # two S-byte flows, 4 links each
        assert sum(per_ch.get(ch, 0) for ch in uplink) == S  # leaf 0 -> spine: one flow's bytes


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_a_mismatch_ends_only_its_job(model: str) -> None:
    """Job 0 then runs as if alone on the uplink: the line-rate closed form under the ideal model, the time of
    the same job run alone under the NCCL model."""
    alone = Jobs([0, 2], model=model)
    alone.all_reduce(0)
    alone.core.progress()
    want = cross_ns(B) if model == "ideal" else alone.done(0)
    h = Jobs([0, 2, 1, 3], model=model)
    h.all_reduce(0)
    h.msg(
        2, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    h.msg(
        3, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_gather", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    assert h.failed == [1]
    errors = [m for m in h.sent[2] + h.sent[3] if m.type == "error"]
    assert len(errors) == 2 and all(e["code"] == "mismatch" and "job j1" in e["text"] for e in errors)
    assert h.core.ranks[2].state == h.core.ranks[3].state == DONE
    h.msg(3, "wait", 0, handles=[1], until=INF_NS)  # a late message of the failed job is ignored
    h.core.progress()
    assert h.done(0) == h.done(1) == want  # job 0 alone on the uplink once job 1 is gone
    for g in (0, 1):
        h.msg(g, "finish", h.done(g), results={}, cpu_s=0.0)
    assert h.core.all_finished()
    out = h.core.finalize()
    assert [j["status"] for j in out["jobs"]] == ["complete", "failed"]
    assert out["jobs"][1]["error"]["code"] == "mismatch"


def test_a_rank_outside_its_job_is_refused_for_that_job_only() -> None:
    h = Jobs([0, 2, 1, 3])
    h.msg(
        2, "coll", 0, h=1, group=[0, 2], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )  # fmt: skip  (job 1 has ranks 0 and 1 only: rank 2 would be another job's)
    assert h.failed == [1]
    text = next(m for m in h.sent[2] if m.type == "error")["text"]
    assert "job j1" in text and "rank 2" in text and "outside 0..1" in text


def test_a_dead_rank_fails_its_job_and_a_stuck_job_is_found_at_the_end() -> None:
    h = Jobs([0, 2, 1, 3])
    h.core.rank_exited(3, 1)
    assert h.failed == [1] and "rank 1 of job j1 exited (code 1)" in h.sent[2][-1]["text"]
    # job 0 deadlocks (rank 1 waits on a collective rank 0 never issues): found when nothing else can move
    h.msg(
        1, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    h.msg(1, "wait", 0, handles=[1], until=INF_NS)
    h.msg(
        0, "coll", 0, h=1, group=[0, 1], seq=1, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    h.msg(0, "wait", 0, handles=[1], until=INF_NS)
    h.core.progress()
    assert h.failed == [1, 0] and h.core.all_finished()
    assert "deadlock" in h.core.job_failures[0]["text"]


def test_all_or_nothing_fails_the_run() -> None:
    h = Jobs([0, 2, 1, 3], all_or_nothing=True)
    with pytest.raises(RunFailed, match="without calling finish"):
        h.core.rank_exited(3, 1)


def test_a_failed_jobs_diagnostic_says_how_its_ranks_are_numbered() -> None:
    h = Jobs([0, 2, 1, 3])
    h.msg(
        2, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    h.msg(
        3, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_gather", nbytes=S, dtype="bf16", root=None, name="", algo=None
    )
    assert "rank r of job j1 is rank 2 + r" in h.core.job_failures[1]["text"]
