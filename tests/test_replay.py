"""In-process replay: the issue rule of the workload format, checked against closed forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.topology.model import Topology
from phantora.workload import workload_from_dict
from tests import stars

B = 100 * 10**9  # 100 Gb/s
L = 1000  # ns per link


def star(n: int) -> Topology:
    return stars.star(n, B, L, tier=1)


def ring_ar_ns(n: int, size: int) -> float:
    """Coarse ring all-reduce on a non-blocking star: 2(n-1)/n * S / B plus one 2-hop path latency."""
    return 2 * (n - 1) / n * size * 8 * 1e9 / B + 2 * L


def replay(data: dict, topo: Topology):
    from phantora.collectives.spec import AlgoOptions
    from phantora.netsim.flow import FlowSimulator
    from phantora.replay import replay_inprocess

    # the closed forms are the ideal model's (line rate, no protocol, no latency)
    wl = workload_from_dict(data, world=topo.num_ranks)
    return replay_inprocess(wl, topo, FlowSimulator(topo), AlgoOptions(model="ideal"))


def test_chain_with_gap_adds_up() -> None:
    topo = star(4)
    size, gap = 8 * 2**20, 50_000
    res = replay(
        {
            "op": [
                {"name": "a", "kind": "all_reduce", "bytes": size, "ranks": "all", "at": "5us"},
                {"name": "b", "kind": "all_reduce", "bytes": size, "ranks": "all", "after": "a", "gap": gap},
            ]
        },
        topo,
    )
    a, b = res.ops
    t = ring_ar_ns(4, size)
    assert a.start_ns == 5000
    assert a.duration_ns == pytest.approx(t, rel=0.01)
    assert b.start_ns == pytest.approx(a.end_ns + gap, abs=2)
    assert b.end_ns == pytest.approx(5000 + 2 * t + gap, rel=0.01)


def test_start_is_latest_issue_over_ranks_and_unrelated_ranks_do_not_wait() -> None:
    topo = star(4)
    size = 2**20
    res = replay(
        {
            "op": [
                {"name": "a", "kind": "all_reduce", "bytes": 4 * size, "ranks": "0-1"},
                {"name": "b", "kind": "all_reduce", "bytes": size, "ranks": "2-3"},
                {"name": "c", "kind": "all_reduce", "bytes": size, "ranks": "all", "after": ["a", "b"], "gap": 1000},
                {"name": "d", "kind": "all_reduce", "bytes": size, "ranks": "2-3", "after": ["a"], "at": "3us"},
            ]
        },
        topo,
    )
    a, b, c, d = res.ops
    assert a.start_ns == 0 and b.start_ns == 0
    assert a.end_ns > b.end_ns  # a moves 4x the bytes on its own pair
    assert c.start_ns == pytest.approx(max(a.end_ns, b.end_ns) + 1000, abs=2)
    assert d.start_ns == 3000  # ranks 2-3 are not in a, so they do not wait for it


def test_ddp_buckets_queue_on_one_stream() -> None:
    """Bucket i starts at max(ready_i, end of bucket i-1): compute-bound then comm-bound cadence."""
    topo = star(8)
    size = 25 * 2**20
    t = ring_ar_ns(8, size)
    every = int(t * 2)  # compute slower than comm: no queueing
    res = replay({"op": [{"name": "x", "kind": "all_reduce", "bytes": size, "every": every, "repeat": 4}]}, topo)
    assert [r.start_ns for r in res.ops] == [i * every for i in range(4)]
    every = int(t / 2)  # comm slower: each waits for the previous
    res = replay({"op": [{"name": "x", "kind": "all_reduce", "bytes": size, "every": every, "repeat": 4}]}, topo)
    for prev, cur in zip(res.ops, res.ops[1:], strict=False):
        assert cur.start_ns == pytest.approx(prev.end_ns, abs=2)
    assert res.makespan_ns == pytest.approx(4 * t, rel=0.01)


def test_cli_replay_writes_outputs_deterministically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        workload = str(root / "workloads" / "ddp_buckets.toml")
        rc = main(["replay", workload, "--topology", "testbed16", "--out", str(out)])
        assert rc == 0
        outs.append(out)
    text = capsys.readouterr().out
    assert "busbw" in text and "bucket.11" in text
    first = (outs[0] / "results.json").read_text()
    assert first == (outs[1] / "results.json").read_text()
    assert (outs[0] / "flows.csv").read_text() == (outs[1] / "flows.csv").read_text()
    data = json.loads(first)
    assert len(data["ops"]) == 12 and data["makespan_ns"] > 10_000_000
    links = (outs[0] / "links.csv").read_text().splitlines()
    assert len(links) > 1 and links[0].startswith("channel,link,from,to")


def test_cli_replay_rejects_rank_outside_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.toml"
    path.write_text('[[op]]\nkind = "all_reduce"\nbytes = 10\nranks = "0-40"\n')
    rc = main(["replay", str(path), "--topology", "testbed16"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "outside the topology" in err and str(path) in err
