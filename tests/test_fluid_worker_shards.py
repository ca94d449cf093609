"""The fluid shards served by threads of the decomposition's workers (`fluid_proc_server.serve_in_thread`, reached
through `ProcShardedFluid`'s ``links``): every start and end that of one flow engine, with no process started; the
shards' requests wait, unsent, until an answer is first needed; a shard whose worker ended is an error naming it.
Here each "worker" is a thread of this process serving a Unix socket in a private directory, as a worker's does."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_proc_server import serve_in_thread
from phantora.netsim.fluid_proc_wire import WORKER_SOCKET
from phantora.netsim.fluid_procs import ProcShardedFluid
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.topology.loader import load_topology
from tests.random_dags import MIB, gpus_by_host
from tests.test_fluid_chains import any_dag, chain_dag, chained
from tests.test_fluid_procs import CAP, marker_case
from tests.test_fluid_shards import two_batches_agree


def served(tmp: Path, shards: int) -> tuple[list[Callable[[], socket.socket]], list[int]]:
    """`shards` shard threads, each at its own socket under `tmp`; their links, and how often each was called."""
    calls = [0] * shards
    links = []
    for i in range(shards):
        d = tmp / f"w{i}"
        d.mkdir(mode=0o700, parents=True)
        serve_in_thread(d / WORKER_SOCKET)

        def link(i: int = i, path: Path = d / WORKER_SOCKET) -> socket.socket:
            calls[i] += 1
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            return sock

        links.append(link)
    return links, calls


def in_workers(topo_name: str, tmp: Path, shards: int) -> tuple[FluidNvlinkSimulator, list[int]]:
    topo = load_topology(topo_name)
    links, calls = served(tmp, shards)
    fluid = ProcShardedFluid(topo, shards, lambda: FlowSimulator(topo, verify=True), timeout_s=60, links=links)
    sim = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)  # type: ignore[arg-type]
    sim.fluid_chains = True
    return sim, calls


@pytest.mark.parametrize(("topo_name", "shards"), [("testbed16", 2), ("rail128", 3)])
def test_shards_in_worker_threads_give_one_flow_engines_completions(
    topo_name: str, shards: int, tmp_path: Path
) -> None:
    hosts = gpus_by_host(topo_name)
    topo = load_topology(topo_name)
    rng = random.Random(7 + shards)
    for trial in range(2):
        dag = chain_dag if trial % 2 else any_dag
        first = dag(rng, hosts, 0, rng.randint(40, 160), [])
        second = dag(rng, hosts, len(first), rng.randint(20, 60), [f.id for f in first])
        one, base = FlowSimulator(topo), chained(topo_name, 0, chains=False)
        sim, calls = in_workers(topo_name, tmp_path / str(trial), shards)
        try:
            two_batches_agree((one, base, sim), first, second, trial)
            fluid = sim.fluid
            assert isinstance(fluid, ProcShardedFluid)
            assert all(p._proc is None for p in fluid.procs)  # (no process started: the "workers" serve them)
            assert calls == [1] * shards  # (each connected once)
            assert [r.bytes for r in fluid.channel_usage()] == [r.bytes for r in base.fluid.channel_usage()]
            assert sum(c > 0 for c in fluid.shard_cpu_s) >= 2  # (each thread's own CPU, reported in its answers)
            assert 0 < fluid.critical_cpu_s <= sum(fluid.shard_cpu_s) + 1e-9
        finally:
            sim.close()


def test_a_marker_across_worker_shards_ends_at_its_closed_form(tmp_path: Path) -> None:
    """As `test_fluid_procs`'s: two 1 MiB NVLink flows capped at 400 Gb/s on testbed16's two hosts (the second
    2 MiB), a marker on host 1 after both (300 ns) and a 1 MiB flow after it: the marker at the later end + 300 ns,
    the last flow one capped transfer + its 2 hops of 25 ns after it. Nothing is sent before the drain asks."""
    flows = marker_case()
    sim, calls = in_workers("testbed16", tmp_path, 2)
    try:
        assert calls == [0, 0]  # (the settings the hybrid sent wait)
        sim.submit(flows, 0)
        got = {x.flow_id: x for x in sim.drain()}
    finally:
        sim.close()
    assert calls == [1, 1]
    xfer = -(-MIB * 8 * 1_000_000_000 // CAP) + 50
    assert got[0].end_ns == xfer
    assert got[1].end_ns == -(-2 * MIB * 8 * 1_000_000_000 // CAP) + 50
    assert got[2].start_ns == got[2].end_ns == got[1].end_ns + 300
    assert (got[3].start_ns, got[3].end_ns) == (got[2].end_ns, got[2].end_ns + xfer)


def test_a_worker_shard_that_ends_is_an_error_naming_it(tmp_path: Path) -> None:
    """Shard 1's "worker" closes its end after the first request: the next answer is an error naming shard 1 and
    its worker."""
    hosts = gpus_by_host("testbed16")
    topo = load_topology("testbed16")
    links, _ = served(tmp_path, 1)
    path = tmp_path / "gone.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def hang_up() -> None:
        conn, _ = listener.accept()
        time.sleep(0.05)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()

    def gone() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return sock

    fluid = ProcShardedFluid(topo, 2, lambda: FlowSimulator(topo), timeout_s=30, links=[links[0], gone])
    sim = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)  # type: ignore[arg-type]
    try:
        with pytest.raises(PhantoraError, match=r"fluid shard 1 \(served by decomposition worker 1\) ended"):
            sim.submit([Flow(0, hosts[1][0], hosts[1][1], MIB)], 0)
            sim.drain()
    finally:
        sim.close()
        listener.close()


def test_links_must_match_the_shards(tmp_path: Path) -> None:
    topo = load_topology("testbed16")
    links, _ = served(tmp_path, 1)
    with pytest.raises(ValueError, match="2 fluid shards need as many links, got 1"):
        ProcShardedFluid(topo, 2, lambda: FlowSimulator(topo), links=links)


def test_a_shard_socket_that_cannot_be_opened_is_an_error_naming_it(tmp_path: Path) -> None:
    """A path taken by a file, and one past a Unix socket's 107-byte limit: each refused, naming the path."""
    taken = tmp_path / WORKER_SOCKET
    taken.write_text("")
    with pytest.raises(PhantoraError, match=f"cannot open the fluid shard socket {taken}: "):
        serve_in_thread(taken)
    long = tmp_path / ("d" * 110) / WORKER_SOCKET
    long.parent.mkdir()
    with pytest.raises(PhantoraError, match="cannot open the fluid shard socket .*d{110}/fluid.sock: "):
        serve_in_thread(long)


def test_a_worker_whose_shard_socket_cannot_be_opened_ends_at_once_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A decomposition worker's network server (`bridge.netserver.main`, as `bridge.workers` starts it) whose run
    directory holds a stale file at its shard socket's place: it exits with code 3 before building its engine (no
    "ready" line), its last words naming the socket."""
    from bridge.netserver import main
    from bridge.workers import worker_spec
    from phantora.netsim.packet_config import PacketConfig

    topo = load_topology("testbed16")
    setup = tmp_path / "setup.msgpack"
    setup.write_bytes(worker_spec(topo, PacketConfig(nvlink="fluid", nic_latency=1000), "packet").to_bytes())
    (tmp_path / WORKER_SOCKET).write_text("")
    monkeypatch.setenv("PHANTORA_TOKEN", "t" * 32)
    assert main(["--setup", str(setup)]) == 3
    err = capfd.readouterr().err
    assert f"cannot open the fluid shard socket {tmp_path / WORKER_SOCKET}" in err
    assert " ready in " not in err  # (the engine's line)
