"""Parallel packet simulation across cut cables in worker processes (issue 38).

`partition=N` runs N worker processes, each an engine over the whole fabric that runs one switch group's nodes,
exchanging the packets of cut cables peer to peer in barrier windows. In the keyed mode that must give one
engine's results byte for byte: completions, FCT records, PFC frames, CE marks, CNPs, per-flow transport
counters and per-channel counters (bytes, packets, paused time, marks, peak queue), for several CCs (DCQCN, HPCC
with its ECMP hash, DCTCP), on a leaf-spine with cross-group traffic and an incast that pauses PFC.
The multi-process runs are slow tests (each worker imports ns-3); the window loop, the peers' failure paths and
the pool's naming of a dead worker are checked in the default run without ns-3.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from bridge.cut_peers import ZmqPeers
from bridge.cut_pool import _wait, run_partitioned
from bridge.errors import BridgeError
from bridge.transport import make_run_dir, new_token, remove_run_dir
from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.cut_windows import NEVER, PeerReport, WindowStats, run_windows
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.netsim.partition import partition_fabric
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

TOPO = leaf_spine(4, 4, 2, nvswitch=False)
RATES = sorted({link.bandwidth_bps for link in TOPO.links})
UNTIL_NS = 20_000_000  # far past the last event of this traffic


def traffic(topo: Topology = TOPO) -> list[Flow]:
    """Every NIC sends 200 KB to the one 5 ahead (across leaves and groups), and 8 NICs of two other leaves
    send 400 KB each to one NIC (an incast over the spines; 300 KB switch buffers: PFC pauses and CE marks)."""
    eps = topo.endpoints
    flows = [Flow(i, s, eps[(i + 5) % len(eps)], 200_000) for i, s in enumerate(eps)]
    flows += [Flow(len(eps) + j, s, eps[1], 400_000) for j, s in enumerate(eps[4:12])]
    return flows


def config(cc: str, ecmp: str | None) -> PacketConfig:
    over = [f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=300000"]
    base = PacketConfig(cc=cc, ecmp_hash=ecmp, kmin_map=dict.fromkeys(RATES, 20_000))
    return apply_overrides(dataclasses.replace(base, kmax_map=dict.fromkeys(RATES, 80_000)), over)


def one_engine(cfg: PacketConfig, flows: list[Flow] | None = None, topo: Topology = TOPO) -> dict[str, Any]:
    from phantora.netsim.packet import Ns3Simulator

    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(traffic() if flows is None else flows, 0)
        done = sim.advance(UNTIL_NS)
        return {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in done),
            "fct": sim.fct_records(),  # each in the engine's own order (time, then its keyed event order)
            "pfc": sim.pfc_events(),
            "marks": sim.ecn_mark_events(),
            "cnps": sim.cnp_events(),
            "transport": dict(sorted(sim.flow_transport().items())),
            "channels": sim._channel_rows(),
            "trims": sim.trims(),
        }


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize(("cc", "ecmp"), [("dcqcn", None), ("hpcc", "hpcc"), ("dctcp", None)])
def test_workers_give_one_engines_results(cc: str, ecmp: str | None) -> None:
    cfg = config(cc, ecmp)
    want = one_engine(cfg)
    assert len(want["completions"]) == len(traffic()) and len(want["fct"]) == len(traffic())
    assert want["pfc"]  # the records compared below are not empty
    if cc != "hpcc":
        assert want["marks"]
    assert bool(want["cnps"]) == (cc == "dcqcn")  # only DCQCN's ACKs carry CNPs (DCTCP's echo ECE)
    for n in (2, 4):
        res = run_partitioned(TOPO, cfg.with_updates(partition=n), traffic(), until=UNTIL_NS)
        got: dict[str, Any] = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions),
            "fct": res.fct,
            "pfc": res.pfc,
            "marks": res.marks,
            "cnps": res.cnps,
            "transport": res.transport,
            "channels": res.channels,
            "trims": res.trims,
        }
        for name, value in want.items():  # records in one engine's order too, ties of one ns across workers
            assert got[name] == value, (cc, n, name)
        if cc == "dcqcn":  # ties that a merge in worker order (the merge before the keys) puts otherwise
            assert res.ties > 100 and by_worker(res.pfc, n) != want["pfc"]
        for w in res.workers:
            assert w["cut"][1] == 1000  # lookahead: the leaf-spine cables' 1 us
            assert w["cut"][2] > 1000 and w["windows"] > 10  # packets crossed, over many windows
            assert w["rejected"] == 0


@pytest.mark.slow
@pytest.mark.ns3
def test_fluid_nvlink_workers_keep_the_fabric_lookahead_and_one_engines_results() -> None:
    """Under nvlink=fluid no packet crosses an NVSwitch, so each joins its host's group (`partition.adopted`): no
    NVLink cable is cut, the windows' lookahead is the fabric's 1 us (it was NVLink's 25 ns), and the fabric
    flows' records are still one keyed engine's."""
    topo = leaf_spine(4, 4, 2, gpus_per_host=4)  # one host of 4 GPUs and its NVSwitch a leaf
    rates = sorted({link.bandwidth_bps for link in topo.links})
    base = PacketConfig(cc="dcqcn", kmin_map=dict.fromkeys(rates, 20_000), kmax_map=dict.fromkeys(rates, 80_000))
    cfg = apply_overrides(base, [f"scheduler={KEYED_SCHEDULER}", "buffer_bytes=300000", "nvlink=fluid"])
    flows = traffic(topo)  # every flow crosses hosts: the fluid side would carry the others
    assert all(topo.shared_nvswitch(f.src, f.dst) is None for f in flows)
    want = one_engine(cfg, flows, topo)
    assert len(want["completions"]) == len(flows) and want["pfc"]
    res = run_partitioned(topo, cfg.with_updates(partition=2), flows, until=UNTIL_NS)
    got = {"completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions), "fct": res.fct,
           "pfc": res.pfc, "marks": res.marks, "cnps": res.cnps, "transport": res.transport,
           "channels": res.channels, "trims": res.trims}  # fmt: skip
    for name, value in want.items():
        assert got[name] == value, name
    for w in res.workers:
        assert w["cut"][1] == 1000 and w["cut"][0] == 4  # 4 of the 8 leaf-spine cables cut, no NVLink one


@pytest.mark.slow
@pytest.mark.ns3
def test_records_of_start_events_merge_in_submit_order() -> None:
    """Compute markers (no bytes, to itself) on every NIC, all done at 1 us: each FCT record is made by its start
    event, which the caller scheduled, so one engine orders them by the caller's count, the submit order. Given
    from the last NIC to the first, the workers' records of that ns interleave, against worker order; each
    worker takes the caller's count of the flows it does not start (`SkipStartKey`), so the keys are one
    engine's (without it two workers give two records one key, and the merge refuses them)."""
    cfg = config("dcqcn", None)
    eps = TOPO.endpoints
    flows = [Flow(i, e, e, 0, delay_ns=1000) for i, e in enumerate(reversed(eps))]
    want = one_engine(cfg, flows)["fct"]
    assert [r.flow_id for r in want] == list(range(len(eps)))  # the submit order
    res = run_partitioned(TOPO, cfg.with_updates(partition=2), flows, until=UNTIL_NS)
    assert res.fct == want and res.ties > 0
    assert by_worker(res.fct, 2, lambda r: r.src) != want


@pytest.mark.slow
@pytest.mark.ns3
def test_empty_flows_across_groups_and_trimmed_packets_are_one_engines() -> None:
    """Issue 38. An empty flow (no bytes) between two groups completes at its start, in its sender's worker: its
    receiver's worker used to keep it in flight for ever, the sender's worker's count of flows in flight wrapped
    below zero, and the sender gave it a transport record one engine has not. Loss-tolerant flows trimmed at a
    switch (DLCP, `trim_bytes`): the workers' trims merge as one engine's (they were left out, and each worker's
    trims and their order keys were never taken, growing with the run)."""
    cfg = config("dcqcn", None).with_updates(trim_bytes=20_000)
    groups = partition_fabric(TOPO, 2, nvlink_fluid=False).groups
    eps = TOPO.endpoints
    a = eps[0]
    b = next(e for e in eps if groups[e] != groups[a])
    flows = traffic()
    n = len(flows)
    flows += [Flow(n, a, b, 0), Flow(n + 1, b, a, 0, delay_ns=3000)]
    flows += [Flow(n + 2 + j, s, eps[1], 400_000, loss_budget=200_000) for j, s in enumerate(eps[12:16])]
    want = one_engine(cfg, flows)
    assert len(want["completions"]) == len(flows) and want["trims"]  # every flow ends; packets were trimmed
    assert {fid for fid, _, _ in want["completions"]} >= {n, n + 1} and n not in want["transport"]
    res = run_partitioned(TOPO, cfg.with_updates(partition=2), flows, until=UNTIL_NS)
    got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions)
    assert got == want["completions"]
    assert (res.fct, res.transport, res.trims) == (want["fct"], want["transport"], want["trims"])
    assert res.stats["flows_in_flight"] == 0


def by_worker(records: list[Any], n: int, node: Callable[[Any], int] = lambda r: r.node) -> list[Any]:
    """Records merged as before their events' keys: in time, then by the worker that runs each one's `node`."""
    groups = partition_fabric(TOPO, n, nvlink_fluid=False).groups
    time = {"FctLine": lambda r: r.start_ns + r.fct_ns}.get(type(records[0]).__name__, lambda r: r.time_ns)
    return sorted(records, key=lambda r: (time(r), groups[node(r)]))  # stable: each worker's own order kept


class FakeNet:
    """A worker's engine reduced to a list of event times, and the windows it was asked to run."""

    def __init__(self, events: list[int], sends: Mapping[int, int], reach: int = 0) -> None:
        self.events = sorted(events)
        self.sends = dict(sends)  # event time -> arrival of a message it sends to the other worker
        self.ran: list[int] = []  # window ends
        self.shared: list[int] = []  # the window starts CutShareBounds was called with
        self.now = 0
        self._out: list[int] = []
        self.reach = reach  # ns from any event (or message arrival) to an arrival across the cut; 0: not told
        self._reach_sent = -1  # the least arrival + reach of the messages sent since CutOutputBound

    def CutOutputBound(self) -> int:  # noqa: N802
        if not self.reach:
            return 0  # no bound better than the lookahead
        mine = [t + self.reach for t in self.events[:1]] + ([self._reach_sent] if self._reach_sent >= 0 else [])
        self._reach_sent = -1
        return min(mine, default=-1)

    def NextEventTime(self) -> int:  # noqa: N802 - PhantoraNetwork's name
        return self.events[0] if self.events else -1

    def CutRunBefore(self, end: int) -> None:  # noqa: N802
        self.ran.append(end)
        while self.events and self.events[0] < end:
            t = self.events.pop(0)
            self.now = t
            if t in self.sends:
                self._out.append(self.sends[t])
                r = self.sends[t] + self.reach
                self._reach_sent = r if self._reach_sent < 0 else min(self._reach_sent, r)

    def CutTakeOutbox(self, group: int) -> bytes:  # noqa: N802
        return b"".join(x.to_bytes(8, "little") for x in self._out)

    def CutTakeMinArrival(self) -> int:  # noqa: N802
        t = min(self._out, default=-1)
        self._out = []
        return t

    def CutDeliver(self, batch: bytes) -> None:  # noqa: N802
        for i in range(0, len(batch), 8):
            t = int.from_bytes(batch[i : i + 8], "little")
            assert t >= self.now, "a message behind the clock"
            self.events.append(t)
        self.events.sort()

    def CutAdvanceTo(self, ns: int) -> None:  # noqa: N802
        self.now = ns

    def CutReleaseBounds(self, floor_ns: int) -> list[int]:  # noqa: N802
        return [-1, -1]  # no flow with a dependency in another worker

    def CutShareBounds(self, floor_ns: int) -> None:  # noqa: N802
        self.shared.append(floor_ns)


class ScriptedPeer:
    """The other worker, played back from its own FakeNet run in lockstep (its reports, computed alike)."""

    def __init__(self, net: FakeNet, lookahead: int) -> None:
        self.net, self.lookahead = net, lookahead
        self.pending: bytes = b""
        self.arr = NEVER

    def exchange(
        self, seq: int, next_ns: int, min_arrival: int, batches: Mapping[int, bytes], *_: Any, **kw: Any
    ) -> list[PeerReport]:
        theirs = self.net.NextEventTime()
        out = self.net.CutOutputBound()
        report = PeerReport(
            1, NEVER if theirs < 0 else theirs, self.arr, self.pending, output=out if out >= 0 else NEVER
        )
        if batches.get(1):
            self.net.CutDeliver(batches[1])
        glob = min(next_ns, min_arrival, report.next_ns, report.min_arrival)
        if glob != NEVER:
            self.net.CutRunBefore(max(glob + self.lookahead, min(kw.get("output", 0), report.output)))
            self.pending = self.net.CutTakeOutbox(0)
            a = self.net.CutTakeMinArrival()
            self.arr = NEVER if a < 0 else a
        return [report]


def test_windows_skip_idle_stretches_and_end_when_nothing_is_left() -> None:
    """Two workers, lookahead 100: events at 0 and 5,000 here, at 50 there; the one at 50 sends a message that
    arrives here at 150 and the one at 150 nothing. Windows start at the least next time over both workers and
    the messages in flight (0, 150, 5,000: the idle stretch between costs no window) and the run ends when
    nothing is left anywhere."""
    mine = FakeNet([0, 5000], {})
    theirs = FakeNet([50], {50: 150})
    stats = WindowStats()
    run_windows(mine, ScriptedPeer(theirs, 100), group=0, groups=2, lookahead_ns=100, until=None, stats=stats)
    assert mine.ran == [100, 250, 5100]
    assert mine.now == 5000 and not mine.events and not theirs.events
    assert stats.windows == 3 and stats.exchanges == 4
    assert mine.shared == [0, 150, 5000]  # after each window, with its start: the completion bounds shared
    assert stats.ended_by == {"lookahead": 3} and stats.widths == {"100-999": 3}  # three windows of 100 ns


def test_windows_run_to_the_workers_earliest_output() -> None:
    """As above, but every event (and every message's arrival) is 300 ns from any arrival across the cut (a NIC
    behind its switch): each window runs to the least event + 300 over both workers, past the lookahead of 100.
    From 0 to 300 (their send at 50 arrives here at 350), from 350 to 650 (that message's arrival + 300: the
    least, our event at 5,000 gives 5,300), from 5,000 to 5,300; the same three windows as the lookahead's, each
    three times as wide, and every message still arrives at or after the window it is delivered at."""
    mine = FakeNet([0, 5000], {}, reach=300)
    theirs = FakeNet([50], {50: 350}, reach=300)
    stats = WindowStats()
    run_windows(mine, ScriptedPeer(theirs, 100), group=0, groups=2, lookahead_ns=100, until=None, stats=stats)
    assert mine.ran == [300, 650, 5300] and theirs.ran == [300, 650, 5300]
    assert mine.now == 5000 and not mine.events and not theirs.events
    assert stats.ended_by == {"earliest output": 3} and stats.widths == {"100-999": 3}


def test_windows_stop_at_the_limit_and_move_the_clock() -> None:
    mine = FakeNet([0, 5000], {})
    theirs = FakeNet([50], {50: 150})
    stats = WindowStats()
    run_windows(mine, ScriptedPeer(theirs, 100), group=0, groups=2, lookahead_ns=100, until=1000, stats=stats)
    assert mine.ran == [100, 250] and mine.events == [5000] and mine.now == 1000


def test_a_silent_peer_is_named() -> None:
    root = make_run_dir()
    try:
        with pytest.raises(BridgeError, match="partition worker 1 did not start"):
            ZmqPeers(root, 0, 2, new_token(), startup_timeout_s=0.3)
    finally:
        remove_run_dir(root)


def test_peers_let_in_only_the_runs_token(tmp_path: Path) -> None:
    """A peer with another token is not let in: its hello is counted as rejected and the barrier times out."""
    root = make_run_dir()
    token = new_token()
    script = (
        "import sys, time; from pathlib import Path; from bridge.cut_peers import ZmqPeers\n"
        "try:\n    ZmqPeers(Path(sys.argv[1]), 1, 2, sys.argv[2], startup_timeout_s=1.5)\n"
        "except Exception:\n    pass\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(root), "not-the-token"])
    try:
        deadline = time.monotonic() + 30
        while not (root / "cut1.endpoint").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(BridgeError, match="no word from hello"):
            ZmqPeers(root, 0, 2, token, startup_timeout_s=1.0)
    finally:
        proc.wait(timeout=30)
        remove_run_dir(root)


def test_a_peer_that_says_hello_twice_counts_once(tmp_path: Path) -> None:
    """Peers are known by the group they declare, not by socket identity: worker 1 saying hello from two sockets
    (as after a reconnect) does not stand in for worker 2, whose silence is named."""
    import threading

    import msgpack
    import zmq

    from bridge.transport import connect_dealer, endpoint_file, write_endpoint_file

    root = make_run_dir()
    token = new_token()
    for g in (1, 2):  # endpoints nobody binds: worker 0's DEALERs connect lazily and wait
        write_endpoint_file(root, f"cut{g}", f"ipc://{root / f'cut{g}.sock'}")
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []  # kept open until the end: a socket closed at once may drop its hello

    def worker_one() -> None:
        path = endpoint_file(root, "cut0")
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        hello = msgpack.packb({"k": "hello", "token": token, "group": 1})
        for _ in range(2):
            socks.append(connect_dealer(ctx, path.read_text().strip()))
            socks[-1].send(hello)

    t = threading.Thread(target=worker_one)
    t.start()
    try:
        with pytest.raises(BridgeError, match=r"no word from hello \(partition worker\(s\) \[2\]\)"):
            ZmqPeers(root, 0, 3, token, startup_timeout_s=2.0)
    finally:
        t.join(timeout=30)
        ctx.destroy(linger=0)
        remove_run_dir(root)


def test_a_malformed_window_report_is_counted_not_raised(tmp_path: Path) -> None:
    """A known peer (the run's token) whose window report lacks its fields: the report is counted as rejected and
    the barrier still ends in its timeout naming the worker, not in a KeyError from deep inside."""
    root = make_run_dir()
    token = new_token()
    script = (
        "import sys, time, msgpack; from pathlib import Path; from bridge.cut_peers import ZmqPeers\n"
        "p = ZmqPeers(Path(sys.argv[1]), 1, 2, sys.argv[2], startup_timeout_s=20)\n"
        "p._peers[0].send(msgpack.packb({'k': 'win', 'seq': 0})); time.sleep(3); p.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(root), token])
    try:
        deadline = time.monotonic() + 30
        while not (root / "cut1.endpoint").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        peers = ZmqPeers(root, 0, 2, token, startup_timeout_s=20, timeout_s=1.0)
        peers._first_timeout_s = 1.0
        try:
            with pytest.raises(BridgeError, match=r"partition worker\(s\) \[1\] at barrier 0"):
                peers.exchange(0, 0, 0, {})
            assert peers.rejected == 1
        finally:
            peers.close()
    finally:
        proc.wait(timeout=30)
        remove_run_dir(root)


def test_a_dead_worker_is_named(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("Traceback\nValueError: something broke\n")
    ok = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    bad = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        with pytest.raises(WorkerDiedError, match=r"partition worker 1 \(pid \d+\) exited with code 3.*something"):
            _wait([(ok, tmp_path / "none.log"), (bad, log)], 60.0)
    finally:
        ok.kill()
        ok.wait()


def test_a_run_past_its_timeout_names_the_workers_still_running(tmp_path: Path) -> None:
    """The pool's limit is the config's partition_timeout_s (a stuck run ends, naming who is still running)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done.wait(timeout=30)
    try:
        with pytest.raises(
            WorkerDiedError, match=r"partition workers \[1\] still running after 1 s.*partition_timeout_s"
        ):
            _wait([(done, tmp_path / "a.log"), (slow, tmp_path / "b.log")], 1.0)
    finally:
        slow.kill()
        slow.wait()
    assert PacketConfig().partition_timeout_s == 3600
    with pytest.raises(InputError, match="must be > 0") as err:
        PacketConfig(partition_timeout_s=0).validate()
    assert err.value.field == "partition_timeout_s"


def test_partition_needs_the_keyed_mode() -> None:
    with pytest.raises(InputError, match="scheduler=ns3::PhantoraKeyedScheduler") as err:
        PacketConfig(partition=2).validate()
    assert err.value.field == "partition"
    # queues are sampled by owner since 2026-11-29 (tests/test_partition_queue_samples.py)
    assert PacketConfig(partition=2, scheduler=KEYED_SCHEDULER, queue_sample_ns=1000).validate().queue_sample_ns == 1000


def test_the_commands_engine_refuses_partition_rather_than_run_one_engine() -> None:
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    cfg = PacketConfig(partition=2, scheduler=KEYED_SCHEDULER)
    with pytest.raises(InputError, match="this caller does not drive them; use one engine") as err:
        make_engine(EngineSpec(network="ns3", packet=cfg), TOPO)
    assert err.value.field == "partition"


@pytest.mark.ns3
def test_a_worker_engine_refuses_what_is_not_split_by_owner() -> None:
    """A worker takes a flow's dependencies only if added before it (each worker must know where every dependency
    completes) and no run call (its windows are driven by its caller); it runs with no peers only through the
    window calls."""
    from phantora.netsim.packet import Ns3Simulator

    cfg = PacketConfig(partition=2, partition_worker=0, scheduler=KEYED_SCHEDULER)
    eps = TOPO.endpoints
    with Ns3Simulator(TOPO, cfg) as sim:
        sim.submit([Flow(1, eps[0], eps[15], 1000)], 0)
        sim.submit([Flow(2, eps[0], eps[15], 1000, deps=(1,))], 0)
        with pytest.raises(InputError, match="flow 3: depends on flow 4, not added before it"):
            sim.submit([Flow(3, eps[0], eps[15], 1000, deps=(4,)), Flow(4, eps[1], eps[14], 1000)], 0)
        with pytest.raises(Exception, match="runs in windows driven by its caller"):
            sim._net.RunUntil(1000)
        assert int(sim._net.CutGroups()) == 2 and int(sim._net.CutStats()[0]) > 0
