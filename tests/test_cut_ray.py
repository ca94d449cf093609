"""Partition workers beyond one machine's processes (issue 38): CurveZMQ between peers, Ray placement, and
`phantora replay` (and the commands that refuse it) with ``--set partition=N``.

Default tests (no ns-3): two CurveZMQ peers exchange a window over loopback tcp and refuse an outsider with the run's
token but not a run key; the pool names a worker that dies under Ray within a poll (fake actors); the partitioned
engine runs its DAG once and hands out completions in time (a fake runner); nccl-tests and run refuse partition=N in
one line naming why, replay what each worker's engine cannot run. Slow (each worker imports ns-3, Ray starts a private
instance): a workload replayed on 2 workers writes one keyed engine's flows.csv byte for byte, Ray-placed workers over
CurveZMQ give the local workers' records, and a worker that dies mid-run on Ray ends the run within seconds, named.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.cut_peers import ZmqPeers
from bridge.cut_pool import run_partitioned
from bridge.cut_watch import wait_workers
from bridge.transport import (
    CURVE_ALWAYS,
    STARTUP_ENV,
    new_token,
    read_server_key,
)
from phantora import progress
from phantora.cli import main
from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.cut_windows import PeerReport
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
from phantora.netsim.partitioned import PartitionedSimulator
from phantora.replay import run_engine
from phantora.topology.generators import leaf_spine
from tests.curve_outsider import dial_as_outsider, published_endpoint, run_dir_and_context

KEYED = ["--set", f"scheduler={KEYED_SCHEDULER}"]
TOPO = leaf_spine(2, 2, 2, nvswitch=False, nic_rate="100Gbps")
NETWORK_FILES = ("flows.csv", "pfc.csv", "queues.csv", "drops.csv", "cnps.csv", "ecn_marks.csv", "links.csv")


def test_curve_peers_exchange_windows_and_refuse_an_outsider() -> None:
    """Two workers on loopback tcp with CurveZMQ: each publishes its key beside its endpoint and gets the other's
    window report; a third party that has the endpoint, the server key and even the token, but not a run key, is
    refused in the handshake (its hello never reaches the worker: nothing is counted as rejected)."""
    token = new_token()
    got: dict[int, list[PeerReport]] = {}
    peers: dict[int, ZmqPeers] = {}
    go = threading.Event()
    with run_dir_and_context() as (root, ctx):

        def worker(g: int) -> None:
            p = ZmqPeers(root, g, 2, token, transport="tcp", curve=True, startup_timeout_s=20, timeout_s=20)
            peers[g] = p
            go.wait(20)
            got[g] = p.exchange(0, 100 + g, 200 + g, {1 - g: f"to {1 - g}".encode()})

        threads = [threading.Thread(target=worker, args=(g,)) for g in (0, 1)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 20
            while len(peers) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            endpoint, server_key = published_endpoint(root, "cut0")
            assert endpoint.startswith("tcp://127.0.0.1:")
            assert server_key != read_server_key(root, "cut1")
            outsider, watch = dial_as_outsider(ctx, endpoint, server_key)
            outsider.send(b'{"k": "hello"}')
            why = None
            while why is None and time.monotonic() < deadline:
                why = watch.failure()
                time.sleep(0.01)
            watch.close()
            assert why is not None and "refused our CURVE key" in why
            go.set()
            for t in threads:
                t.join(timeout=30)
            assert [(r.group, r.next_ns, r.min_arrival, r.batch) for r in got[0]] == [(1, 101, 201, b"to 0")]
            assert [(r.group, r.next_ns, r.min_arrival, r.batch) for r in got[1]] == [(0, 100, 200, b"to 1")]
            assert peers[0].rejected == 0 and peers[1].rejected == 0
        finally:
            go.set()
            for p in peers.values():
                p.close()


class FakeActor:
    """A Ray-placed worker as the pool sees it: still running, then (worker 1) exits 1 after `dies_after` s."""

    def __init__(self, dies_after: float | None) -> None:
        self.t0, self.dies_after = time.monotonic(), dies_after

    def poll(self) -> int | None:
        return 1 if self.dies_after is not None and time.monotonic() - self.t0 > self.dies_after else None

    def describe(self) -> str:
        return "pid 4242, Ray actor, at tcp://10.0.0.2:5555"

    def last_words(self) -> str:
        return "InputError: something broke"


def test_a_worker_that_dies_on_ray_ends_the_run_within_a_poll() -> None:
    t0 = time.monotonic()
    named = r"partition worker 1 \(pid 4242, Ray actor, at tcp://10.0.0.2:5555\) exited with code 1; its last words"
    with pytest.raises(WorkerDiedError, match=named + ": InputError: something"):
        wait_workers([FakeActor(None), FakeActor(0.2)], 60.0, interval_s=0.25)
    assert time.monotonic() - t0 < 2.0  # not the peers' 60 s barrier timeout, nor the run's limit


@pytest.mark.parametrize("command", ["nccl-tests", "run"])
def test_commands_that_submit_as_they_go_refuse_partition_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    opts = ["--topology", "hpcc/leafspine16", "--network", "ns3", *KEYED, "--set", "partition=2"]
    if command == "nccl-tests":
        argv = ["nccl-tests", "all_reduce_perf", "-b", "8", "-e", "8", *opts]
    else:
        argv = ["run", *opts, str(script)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "field 'partition'" in err
    why = "previous one left" if command == "nccl-tests" else "the live bridge submits"
    assert why in err and "partition=0" in err


@dataclasses.dataclass
class FakeResult:
    """What `PartitionedSimulator` reads of `bridge.cut_pool.PartitionResult`."""

    completions: list[Completion]
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    workers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ties: int = 0


def test_the_partitioned_engine_runs_the_dag_once_and_hands_out_completions_in_time() -> None:
    """No ns-3: the workers' runner is called once, with every batch submitted before the first run call and no
    limit; completions come out to the time asked for, a watched one stops the hand-out at its ns (all of it);
    a flow submitted once the run has started, and a drain limit, are refused naming the field."""
    done = [Completion(i, 0, end, 10, 0, 1) for i, end in ((1, 100), (2, 200), (3, 200), (4, 300))]
    calls: list[tuple[Any, ...]] = []

    def runner(*args: Any) -> FakeResult:
        calls.append(args)
        return FakeResult(done)

    cfg = PacketConfig(scheduler=KEYED_SCHEDULER, partition=2)
    sim = PartitionedSimulator(TOPO, cfg, runner)
    eps = TOPO.endpoints
    sim.submit([Flow(1, eps[0], eps[2], 10), Flow(2, eps[1], eps[3], 10, deps=(1,))], 0)
    sim.submit([Flow(3, eps[0], eps[3], 10), Flow(4, eps[2], eps[0], 10)], 50)
    assert sim.in_flight() == 4 and sim.now() == 50
    assert [c.flow_id for c in sim.advance(150)] == [1] and sim.now() == 150
    assert [c.flow_id for c in sim.advance_watching(INF_NS, {2})] == [2, 3] and sim.now() == 200
    assert len(calls) == 1 and [at for at, _ in calls[0][2]] == [0, 50] and calls[0][3] is None
    assert calls[0][5] is True  # a replay's drain: the workers stop after the ns of the last completion
    with pytest.raises(InputError, match="submitted once it has started") as err:
        sim.submit([Flow(5, eps[0], eps[1], 10)], 200)
    assert err.value.field == "partition"
    with pytest.raises(InputError, match="not to a limit"):
        sim.drain(1000)
    assert [c.flow_id for c in sim.drain()] == [4] and sim.now() == 300 and sim.in_flight() == 0
    assert len(calls) == 1


def test_partitioned_progress_shows_no_eta_before_the_workers_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workers run the DAG whole in the first call: the progress lines say so and give no ETA (one taken from
    the first completions handed out after the run would be the whole run's wall time over a few flows), then
    every flow done; a beat the workers send from inside the run is shown as it comes."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)  # a line at every update
    done = [Completion(i, 0, 100 * i, 10, 0, 1) for i in range(1, 5)]
    calls: list[float] = []

    def runner(*args: Any, on_beat: Any = None, beat_s: float = 0.5) -> FakeResult:
        calls.append(time.monotonic())
        on_beat(progress.Beat(250, 1_234, 0.5, workers=2, slowest=1))  # (the display's: progress="lines")
        return FakeResult(done)

    sim = PartitionedSimulator(TOPO, PacketConfig(scheduler=KEYED_SCHEDULER, partition=2), runner)
    eps = TOPO.endpoints
    flows = [Flow(i, eps[0], eps[1], 10) for i in range(1, 5)]
    got = run_engine(sim, flows, progress="lines", desc="replay")
    assert [c.flow_id for c in got] == [1, 2, 3, 4] and len(calls) == 1
    err = capsys.readouterr().err.splitlines()
    assert "4 flows run whole by 2 partition workers" in err[0]
    assert "0/4 flows (0%), simulated 0.000 ms, 1,234 events" in err[1] and "2 workers: 0.5 CPU s" in err[1]
    assert err[-1].startswith("[phantora] replay: 4/4 flows (100%)")
    assert not any("ETA" in line.split(": no ETA")[-1] for line in err)


@pytest.mark.parametrize("settings", [["nic_latency=1us"], ["reuse=on"]])
def test_replay_refuses_what_the_workers_engine_does_not_run(
    settings: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any worker starts (nvlink=fluid alone runs: tests/test_partition_fluid.py; with reuse=on too, on the
    stepped workers: tests/test_partition_reuse.py; with nic_latency, alone or with reuse=on too:
    tests/test_partition_nic_latency.py)."""
    wl = tiny_workload(tmp_path / "tiny.toml")
    argv = ["replay", str(wl), "--topology", "hpcc/leafspine16", "--network", "ns3", *KEYED, "--set", "partition=2"]
    assert main([*argv, *(x for s in settings for x in ("--set", s))]) == 2
    err = capsys.readouterr().err.strip()
    name = settings[-1].split("=")[0]
    assert len(err.splitlines()) == 1 and f"field '{name}'" in err and "partition=0" in err


def tiny_workload(path: Path) -> Path:
    path.write_text(
        'name = "tiny"\n[defaults]\nranks = "all"\ndtype = "bf16"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "16KiB"\n'
        '[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "64KiB"\nafter = ["a2a"]\ngap = "1us"\n'
    )
    return path


@pytest.mark.slow
@pytest.mark.ns3
def test_a_replay_on_two_workers_writes_one_keyed_engines_files(tmp_path: Path) -> None:
    """(Slow: 8 CPU s, each worker imports ns-3.) A workload (an all-to-all, then a ring all-reduce 1 us after it:
    markers, dependencies across workers) on a leaf-spine of 2 leaves x 2 hosts: every network file byte for byte
    as one keyed engine's replay, which stops after the ns of the last completion (the workers ran on to every
    flow's last ACK until 2026-12-01, so their files were those of that engine after `finish()`, which differ)."""
    from bridge.cut_pool import run_partitioned_batches
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.replay import replay_inprocess
    from phantora.report.replay_report import write_replay_outputs
    from phantora.workload import load_workload

    topo = leaf_spine(2, 2, 2, nvswitch=False, nic_rate="100Gbps")
    wl = load_workload(tiny_workload(tmp_path / "tiny.toml"), world=topo.num_ranks)
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, queue_sample_ns=0)

    def replay(config: PacketConfig, out: Path, finish: bool = False) -> Any:
        spec = EngineSpec("ns3", config)
        sim = make_engine(spec, topo, partitioner=run_partitioned_batches)
        try:
            res = replay_inprocess(wl, topo, sim)
            if finish:
                assert sim.finish()  # type: ignore[attr-defined]
            write_replay_outputs(out, res, workload=wl.name, topology=topo, network="ns3", engine=sim, spec=spec)
            return res, sim.stats()
        finally:
            sim.close()

    one, _ = replay(cfg, tmp_path / "one")
    replay(cfg, tmp_path / "finished", finish=True)
    two, stats = replay(dataclasses.replace(cfg, partition=2), tmp_path / "two")
    assert stats["partition"]["workers"] == 2 and stats["partition"]["windows"] > 1
    assert [(r.name, r.start_ns, r.end_ns) for r in two.ops] == [(r.name, r.start_ns, r.end_ns) for r in one.ops]
    flows = (tmp_path / "one" / "flows.csv").read_bytes()
    assert (tmp_path / "two" / "flows.csv").read_bytes() == flows and flows.count(b"\n") > len(one.completions) // 2
    for name in NETWORK_FILES:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    # the last ACKs come after the last completion: run to them, links.csv counts more
    assert (tmp_path / "finished" / "links.csv").read_bytes() != (tmp_path / "one" / "links.csv").read_bytes()


def cross_traffic() -> list[Any]:
    eps = TOPO.endpoints
    return [Flow(i, s, eps[(i + 2) % len(eps)], 100_000) for i, s in enumerate(eps)]


@pytest.mark.slow
def test_ray_placed_workers_over_curve_give_the_local_workers_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray=local`` with PHANTORA_BRIDGE_CURVE=1 (as on other machines): each actor's worker binds tcp, runs
    CurveZMQ with its own key, and gets the other's endpoint and key through the driver; the merged records
    equal those of local workers over ipc, to the ns."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    monkeypatch.setenv(CURVE_ALWAYS, "1")
    monkeypatch.setenv(STARTUP_ENV, "900")  # a loaded machine importing ns-3 in three processes
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, partition=2)
    local = run_partitioned(TOPO, cfg, cross_traffic())
    on_ray = run_partitioned(TOPO, dataclasses.replace(cfg, ray="local"), cross_traffic())
    assert len(local.completions) == len(cross_traffic())
    assert [w["curve"] for w in on_ray.workers] == [True, True] and [w["curve"] for w in local.workers] == [False] * 2
    for name in ("completions", "fct", "pfc", "marks", "cnps", "transport", "channels"):
        assert getattr(on_ray, name) == getattr(local, name), name


@pytest.mark.slow
def test_a_worker_that_dies_mid_run_on_ray_is_named_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 1 gets flows it cannot read (after it has bound and met worker 0): it exits 1, and the driver ends the
    run naming it, long before worker 0's start-up barrier (here 900 s) would."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    monkeypatch.setenv(STARTUP_ENV, "900")
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_ray import run_on_ray

    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, partition=2, ray="local")
    captured: list[list[dict[str, Any]]] = []

    def spy(address: str, setups: list[dict[str, Any]], token: str, timeout_s: float) -> Any:
        setups[1] = {**setups[1], "batches": [[0, {"id": "not columns"}]]}
        captured.append(setups)
        return run_on_ray(address, setups, token, timeout_s)

    import bridge.cut_ray

    t0 = time.monotonic()
    orig = bridge.cut_ray.run_on_ray
    bridge.cut_ray.run_on_ray = spy  # type: ignore[assignment]
    try:
        with pytest.raises(WorkerDiedError, match=r"partition worker 1 \(pid \d+, Ray actor, at tcp://127\.0\.0\.1:"):
            run_partitioned_batches(TOPO, cfg, [(0, cross_traffic())])
    finally:
        bridge.cut_ray.run_on_ray = orig  # type: ignore[assignment]
    assert captured and time.monotonic() - t0 < 600.0  # ns-3's and Ray's start included; the poll itself: above
