"""Rank deduplication in the coordinator: K live ranks stand for N (phantora.collectives.mirrors).

The reference is the same job with every rank live: mirrored runs must put the same flows on the
network and give each live rank the completion time of its slowest mirror, exactly. Closed forms
anchor the single-copy cases (ring all-reduce on a non-blocking switch) under the ideal model (line rate);
under the NCCL model, the default, the single copy takes exactly the time of one copy run alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import CoordinatorCore
from bridge.errors import RunFailed
from bridge.protocol import Message, decode, encode
from phantora.collectives import decompose
from phantora.collectives.mirrors import Mirrors, NotPeriodicError
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

B = 100 * 10**9
LAT = 1000
S = 4 * 2**20


def ring_allreduce_ns(nbytes: int, n: int) -> int:
    return -(-2 * (n - 1) * nbytes * 8 * 10**9 // (n * B)) + 2 * LAT


class Job:
    """A CoordinatorCore whose ranks follow one SPMD script: TP groups of `tp` consecutive ranks, DP groups across."""

    def __init__(self, world: int, live: int | None, tp: int, topo: Any, algo: AlgoOptions | None = None) -> None:
        self.world, self.tp = world, tp
        self.live = world if live is None else live
        self.sent: dict[int, list[Message]] = {r: [] for r in range(self.live)}
        self.core = CoordinatorCore(
            FlowSimulator(topo), topo, world, window_ns=0, algo=algo or AlgoOptions(), live=live,
            send=lambda r, raw: self.sent[r].append(decode(raw)),
        )  # fmt: skip
        self.h = dict.fromkeys(range(self.live), 0)

    def tp_group(self, r: int) -> list[int]:
        base = r - r % self.tp
        return list(range(base, base + self.tp))

    def dp_group(self, r: int) -> list[int]:
        return list(range(r % self.tp, self.world, self.tp))

    def coll(self, r: int, t: int, group: list[int], seq: int, kind: str, nbytes: int, root: int | None = None) -> int:
        self.h[r] += 1
        m = encode("coll", t, h=self.h[r], group=group, seq=seq, kind=kind, nbytes=nbytes, dtype="bf16", root=root,
                   name=f"{kind}{seq}", algo=None)  # fmt: skip
        self.core.on_message(r, decode(m))
        return self.h[r]

    def step(self) -> dict[int, list[int]]:
        """Each live rank runs: TP all-reduce, DP reduce-scatter, broadcast from its DP group's first rank.

        A rank issues its next op the moment its previous one completes, then finishes; returns
        each live rank's completion times.
        """
        ops = [("all_reduce", self.tp_group, 0), ("reduce_scatter", self.dp_group, 0), ("broadcast", self.dp_group, 1)]
        done: dict[int, list[int]] = {r: [] for r in range(self.live)}

        def issue(r: int, t: int) -> None:
            kind, groups, seq = ops[len(done[r])]
            g = groups(r)
            h = self.coll(r, t, g, seq, kind, S, root=g[0] if kind == "broadcast" else None)
            self.core.on_message(r, decode(encode("wait", t, handles=[h], until=2**62)))

        return self.drive(len(ops), issue, done)

    def drive(self, n_ops: int, issue: Any, done: dict[int, list[int]]) -> dict[int, list[int]]:
        """Issue each live rank's first op, then its next one as each completes; finish after `n_ops`."""
        for r in range(self.live):
            issue(r, 0)
        seen = dict.fromkeys(range(self.live), 0)
        while not self.core.all_finished():
            self.core.progress()
            for r in range(self.live):
                results = [m for m in self.sent[r] if m.type == "result"]
                if len(results) > seen[r]:
                    seen[r] = len(results)
                    t = results[-1]["t_done"]
                    done[r].append(t)
                    if len(done[r]) < n_ops:
                        issue(r, t)
                    else:
                        self.core.on_message(r, decode(encode("finish", t, results={}, cpu_s=0.0)))
        return done


def test_mirrors_copies_and_symmetry_errors() -> None:
    m = Mirrors(16, 4)
    copies = m.copies((0, 1, 2, 3))
    assert list(copies) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert list(m.copies(tuple(range(16)))) == [tuple(range(16))]  # FSDP on the world: one collective
    assert list(m.copies((1, 5, 9, 13))) == [(1, 5, 9, 13)]  # a DP group is its own shift
    assert m.live_members((1, 5, 9, 13)) == (1,) and m.live_members(tuple(range(16))) == (0, 1, 2, 3)
    assert m.canonical((9, 10, 11, 8)) == ((1, 2, 3, 0), 2)
    assert m.canonical_pair(9, 2) == (1, 10)
    with pytest.raises(NotPeriodicError, match="not periodic in 4 ranks"):
        Mirrors(16, 4).copies(tuple(range(8)))  # TP groups of 8 cannot be mirrored with 4 live ranks
    with pytest.raises(ValueError):
        Mirrors(16, 5)


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_a_mirrored_tp_allreduce_is_one_copy_per_host_at_the_closed_form(model: str) -> None:
    """Ideal model: the ring's line-rate closed form. NCCL model: exactly the time of one copy alone (the copies
    share no link on the non-blocking switch)."""
    topo = leaf_spine(1, 16, 0, nic_rate="100Gbps", latency="1us")  # one non-blocking switch
    algo = AlgoOptions(model=model)
    job = Job(16, 4, 4, topo, algo)
    done = job.step()
    rec = job.core.records[0]
    one = decompose(Collective("all_reduce", (0, 1, 2, 3), S, "bf16"), topo, algo)
    assert rec.copies == 4 and rec.nflows == 4 * len(one.flows)
    if model == "ideal":
        want = ring_allreduce_ns(S, 4)
    else:
        sim = FlowSimulator(topo)
        sim.submit(one.flows, at=0)
        want = max(c.end_ns for c in sim.drain())
        assert want != ring_allreduce_ns(S, 4)  # NCCL's latency and throughput, not the line rate
    for r in range(4):
        assert done[r][0] == want


@pytest.mark.parametrize("live", [4, 8])
def test_mirrored_job_equals_the_job_with_every_rank_live(live: int) -> None:
    """TP x DP on an oversubscribed 2-leaf fabric: copies contend; times must equal the full job's."""
    topo = leaf_spine(2, 8, 1, nic_rate="100Gbps", latency="1us", oversubscription=4)
    full = Job(16, None, 4, topo).step()
    mirrored = Job(16, live, 4, topo)
    got = mirrored.step()
    for r in range(live):
        want = [max(full[m][i] for m in range(r, 16, live)) for i in range(3)]
        assert got[r] == want, (r, got[r], want)
    full_job = Job(16, None, 4, topo)
    full_job.step()
    assert sum(r.nflows for r in mirrored.core.records) == sum(r.nflows for r in full_job.core.records)


def test_mirrored_mismatch_is_still_reported() -> None:
    topo = leaf_spine(1, 16, 0, nic_rate="100Gbps", latency="1us")
    job = Job(16, 4, 4, topo)
    job.coll(0, 0, list(range(16)), 0, "all_gather", S)
    with pytest.raises(RunFailed, match="mismatch"):
        job.coll(1, 0, list(range(16)), 0, "all_gather", 2 * S)


def test_a_transfer_between_mirrors_is_refused_with_the_counts_that_work() -> None:
    """torchtitan's pipeline is outermost: on 8 ranks with 2 stages, stage peers are 4 apart, so 4 live
    ranks mirror both ends of a send; only K = 8 (no deduplication) keeps the peers apart."""
    from bridge.matching import Call, Matcher

    m = Matcher(8, Mirrors(8, 4))
    call = Call(rank=2, handle=1, kind="send", nbytes=4, dtype="uint8", root=None, t=0, name="send#0")
    with pytest.raises(RunFailed, match=r"ranks 2 and 6 \(4 apart\).*divide 8 but not 4: 8 \(every rank live"):
        m.transfer(call, peer=6, tag=0, seq=0, is_send=True)
    ok = Matcher(8, Mirrors(8, 4))  # stage peers 1 apart (the pipeline innermost): a transfer between live ranks
    assert ok.transfer(call, peer=3, tag=0, seq=0, is_send=True) is None  # waits for the receiver


class PipelineJob(Job):
    """Pipeline stages innermost (rank = dp * 2 + stage): stage 0 sends an activation to stage 1 of its pipeline,
    then both all-reduce over their DP group (ranks of the same stage)."""

    def step(self) -> dict[int, list[int]]:
        done: dict[int, list[int]] = {r: [] for r in range(self.live)}

        def issue(r: int, t: int) -> None:
            self.h[r] += 1
            if not done[r]:
                peer = r + 1 if r % 2 == 0 else r - 1
                m = encode("p2p", t, h=self.h[r], peer=peer, send=r % 2 == 0, tag=0, seq=0, nbytes=S, name="act")
                self.core.on_message(r, decode(m))
            else:
                self.h[r] -= 1
                group = list(range(r % 2, self.world, 2))
                self.coll(r, t, group, 0, "all_reduce", S)
            self.core.on_message(r, decode(encode("wait", t, handles=[self.h[r]], until=2**62)))

        return self.drive(2, issue, done)


@pytest.mark.parametrize("live", [2, 4])
def test_a_mirrored_pipeline_with_stages_innermost_equals_the_full_job(live: int) -> None:
    """Deduplication of a pipeline job where the shift symmetry holds (stage peers 1 apart, K a multiple
    of the 2 stages): sends and the DP all-reduce take exactly the full job's times."""
    topo = leaf_spine(2, 8, 1, nic_rate="100Gbps", latency="1us", oversubscription=4)
    full = PipelineJob(16, None, 2, topo).step()
    got = PipelineJob(16, live, 2, topo).step()
    for r in range(live):
        want = [max(full[m][i] for m in range(r, 16, live)) for i in range(2)]
        assert got[r] == want, (r, got[r], want)
    assert full[0][0] == full[1][0] > 0  # a send completes for both ends at once
