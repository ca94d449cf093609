"""Checkpoint storage shared by the ranks (bridge/storage_engine.py, bridge/storage_io.py), against closed forms.

Bandwidths W per host and F for the shared filesystem, files of B bytes, all in round numbers so every time is an
integer ns: a lone file takes B / min(W, F); N files started together on one host take N·B / W each; files on H
hosts sharing F end by max(N_h·B / W, total / F); a file that starts while another is half done shares from then
on. Then the same through the coordinator (no sockets): a rank's `io` request and its `wait`, a lone writer, four
writers on two hosts, and the mirrors of rank deduplication.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.core import CoordinatorCore
from bridge.errors import RunFailed
from bridge.protocol import Message, decode, encode
from bridge.storage_engine import StorageEngine
from phantora.collectives.spec import AlgoOptions
from phantora.launcher import RunConfig, launch
from phantora.netsim.flow import FlowSimulator
from phantora.results.run_dir import rank_steps
from phantora.topology.generators import leaf_spine

SCRIPTS = Path(__file__).resolve().parent / "scripts"
GB = 10**9
SECOND = 10**9  # ns


def ends(engine: StorageEngine) -> dict[int, int]:
    return {c.flow_id: c.end_ns for c in engine.drain()}


def test_a_lone_file_takes_bytes_over_the_smaller_bandwidth() -> None:
    host_only = StorageEngine(2 * GB, None)
    host_only.start(-1, 0, 0, GB, at=0)
    assert ends(host_only) == {-1: SECOND // 2}  # 1 GB at 2 GB/s
    shared = StorageEngine(2 * GB, 1 * GB)
    shared.start(-1, 0, 0, GB, at=3)
    assert ends(shared) == {-1: 3 + SECOND}  # the filesystem's 1 GB/s binds


def test_n_files_on_one_host_take_n_times_as_long() -> None:
    engine = StorageEngine(2 * GB, None)
    for i in range(4):
        engine.start(-1 - i, i, 0, GB // 10, at=0)
    assert ends(engine) == dict.fromkeys((-1, -2, -3, -4), 4 * (GB // 10) * SECOND // (2 * GB))  # N·B/W = 0.2 s


def test_hosts_sharing_a_filesystem() -> None:
    """2 hosts x 2 files of 1 GB, W = 2 GB/s: with F = 1 GB/s, total / F = 4 s binds; with F = 10 GB/s,
    N_h·B / W = 1 s."""
    for shared, want in ((1 * GB, 4 * SECOND), (10 * GB, SECOND)):
        engine = StorageEngine(2 * GB, shared)
        for i in range(4):
            engine.start(-1 - i, i, i // 2, GB, at=0)
        assert set(ends(engine).values()) == {want}


def test_uneven_hosts_share_max_min() -> None:
    """Host 0 has 4 files, host 1 one, 1 GB each, W = 2 GB/s, F = 3 GB/s. Max-min: host 0's link holds its
    files to 0.5 GB/s each, the lone file gets the filesystem's rest, 1 GB/s, and ends at 1 s; host 0's end at
    2 s = max(N_h·B/W, total/F) = max(2 s, 5/3 s)."""
    engine = StorageEngine(2 * GB, 3 * GB)
    for i in range(4):
        engine.start(-1 - i, i, 0, GB, at=0)
    engine.start(-5, 4, 1, GB, at=0)
    assert ends(engine) == {-1: 2 * SECOND, -2: 2 * SECOND, -3: 2 * SECOND, -4: 2 * SECOND, -5: SECOND}


def test_a_later_file_shares_from_its_start() -> None:
    """1 GB at 1 GB/s from 0; at 0.5 s a 0.5 GB file joins on the same host: both have 0.5 GB left and share
    0.5 GB/s each, so both end at 1.5 s."""
    engine = StorageEngine(GB, None)
    engine.start(-1, 0, 0, GB, at=0)
    engine.start(-2, 1, 0, GB // 2, at=SECOND // 2)
    assert ends(engine) == {-1: 3 * SECOND // 2, -2: 3 * SECOND // 2}


def test_advance_stops_at_until_and_refuses_the_past() -> None:
    engine = StorageEngine(GB, None)
    engine.start(-1, 0, 0, GB, at=0)
    assert engine.advance(SECOND // 2) == [] and engine.now() == SECOND // 2 and engine.next_event_time() == SECOND
    with pytest.raises(AssertionError, match="before the storage's time"):
        engine.start(-2, 0, 0, 1, at=0)
    with pytest.raises(ValueError, match="positive"):
        StorageEngine(0, None)


class Ranks:
    """A CoordinatorCore on 2 hosts of 2 GPUs (flow engine), ranks sending io requests and waits."""

    def __init__(self, world: int = 4, live: int | None = None) -> None:
        topo = leaf_spine(1, 4, 0, nic_rate="100Gbps", latency="1us", gpus_per_host=2)
        self.sent: dict[int, list[Message]] = {r: [] for r in range(world)}
        send = lambda r, raw: self.sent[r].append(decode(raw))  # noqa: E731
        self.core = CoordinatorCore(FlowSimulator(topo), topo, world, window_ns=0, algo=AlgoOptions(), send=send,
                                    live=live)  # fmt: skip

    def msg(self, rank: int, type_: str, t: int, **fields: Any) -> None:
        self.core.on_message(rank, decode(encode(type_, t, **fields)))

    def write(self, rank: int, t: int, nbytes: int, h: int = 1, host: float = 2 * GB, shared: float | None = None):
        self.msg(rank, "io", t, h=h, kind="write", nbytes=nbytes, name="ckpt", host_bps=host, shared_bps=shared)
        self.msg(rank, "wait", t, handles=[h], until=1 << 62)

    def done(self, rank: int) -> int:
        got = [m for m in self.sent[rank] if m.type == "result"]
        assert got, f"rank {rank} got no result"
        return int(got[-1]["t_done"])


def test_a_lone_writer_gets_the_whole_host_link() -> None:
    """Rank 0 alone writes 1 GB at 2 GB/s (its host-mate only computes, to 10 s): 0.5 s, not the 1 s of a fixed
    half."""
    r = Ranks()
    r.write(0, 1000, GB)
    for other in (1, 2, 3):
        r.msg(other, "finish", 10 * SECOND, results={}, cpu_s=0.0)
    r.core.progress()
    assert r.done(0) == 1000 + SECOND // 2


@pytest.mark.parametrize("order", [(0, 2), (2, 0)])
def test_transfers_start_in_time_and_rank_order_whatever_order_they_arrive_in(order: tuple[int, int]) -> None:
    """Ranks 0 and 2 (one per host) each write 1 GB at 0 through a shared filesystem of F = 1 GB/s: both end at
    2 GB / F = 2 s, and the records list rank 0's transfer first (id -1) in either arrival order."""
    r = Ranks()
    for rank in order:
        r.msg(rank, "io", 0, h=1, kind="write", nbytes=GB, name=f"ckpt{rank}", host_bps=2 * GB, shared_bps=1 * GB)
    for rank in order:
        r.msg(rank, "wait", 0, handles=[1], until=1 << 62)
    for other in (1, 3):
        r.msg(other, "finish", 0, results={}, cpu_s=0.0)
    r.core.progress()
    assert [r.done(rank) for rank in (0, 2)] == [2 * SECOND] * 2
    out = r.core.finalize()["storage_io"]
    assert [(x["rank"], x["name"], x["end_ns"]) for x in out] == [(0, "ckpt0", 2 * SECOND), (2, "ckpt2", 2 * SECOND)]


def test_four_writers_on_two_hosts_through_the_coordinator() -> None:
    """Every rank writes 1 GB; hosts of 2 ranks at W = 2 GB/s, F = 1 GB/s: total / F = 4 s binds."""
    r = Ranks()
    for rank in range(4):
        r.write(rank, 0, GB, shared=1 * GB)
    r.core.progress()
    assert [r.done(rank) for rank in range(4)] == [4 * SECOND] * 4
    out = r.core.finalize()
    assert [x["end_ns"] for x in out["storage_io"]] == [4 * SECOND] * 4


def test_mirrors_write_too() -> None:
    """Rank deduplication, 2 live ranks for 4: live rank 0 also stands for rank 2 (the other host); each host
    has 2 writers of 1 GB. W = 2 GB/s, F = 2 GB/s: total 4 GB / F = 2 s, for the live ranks as for the rest."""
    r = Ranks(live=2)
    for rank in range(2):
        r.write(rank, 0, GB, shared=2 * GB)
    r.core.progress()
    assert [r.done(rank) for rank in range(2)] == [2 * SECOND] * 2
    assert len(r.core.finalize()["storage_io"]) == 4


def test_ranks_naming_different_storages_fail_in_one_line() -> None:
    r = Ranks()
    r.write(0, 0, GB)
    with pytest.raises(RunFailed, match="must agree"):
        r.msg(1, "io", 0, h=1, kind="write", nbytes=GB, name="x", host_bps=3 * GB, shared_bps=None)


@pytest.mark.slow
def test_a_rank_0_save_and_an_every_rank_save_in_a_run(tmp_path: Path) -> None:
    """`phantora run --storage 1 --nproc 2` (one host of testbed16, 1 GB/s): rank 0's lone torch.save costs 1 ns a
    byte (the whole link), the two ranks' saves at once 2 ns a byte each (half the link each)."""
    out = tmp_path / "out"
    cfg = RunConfig(str(SCRIPTS / "storage_writers.py"), [str(tmp_path)], "testbed16", nproc=2, tensors="real")
    cfg.out_dir, cfg.env, cfg.timeout_s = out, {"PHANTORA_STORAGE_GBPS": "1"}, 300
    launch(cfg)
    lone = (tmp_path / "rank0.pt").stat().st_size
    each = (tmp_path / "all0.pt").stat().st_size  # the archive's record names differ by the file's name
    assert lone > 4 * 2**20 and (tmp_path / "all1.pt").stat().st_size == each
    steps = rank_steps(out)
    io = {r: [(x.get("storage_bytes", 0), x.get("storage_ns", 0)) for x in lines] for r, lines in steps.items()}
    assert io == {0: [(0, 0), (lone, lone), (each, 2 * each)], 1: [(0, 0), (0, 0), (each, 2 * each)]}
