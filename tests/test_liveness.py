"""A peer's silence counts only while its process makes no progress (bridge/liveness.py).

Real processes: our own, a zombie and a reaped child; a child that spins (busy, as a coordinator planning a
collective of 1,024 ranks), then the same child stopped (SIGSTOP: alive, no CPU time). A network server on real
sockets waits for that busy coordinator past its silence limit and leaves once it is stopped. The launcher and the
ranks: tests/test_bridge_run.py (a busy coordinator, a stopped one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from bridge.liveness import LOOK_S, Silence, progress_mark
from bridge.netserver import NetServer
from bridge.protocol import decode, encode
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

SPIN = [sys.executable, "-c", "while True: pass"]
SIDE_THREAD = """
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
time.sleep(100)
"""


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(SPIN)
    yield proc
    proc.kill()
    proc.wait()


def test_progress_mark_sees_cpu_time_and_not_the_dead() -> None:
    first = progress_mark(os.getpid())
    assert first is not None
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:  # 10 clock ticks at the usual 100 Hz
        pass
    later = progress_mark(os.getpid())
    assert later is not None and later[0] == first[0] and later[1] > first[1]
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while (
        subprocess.run(["ps", "-o", "stat=", "-p", str(zombie.pid)], capture_output=True, text=True).stdout[:1] != "Z"
    ):
        time.sleep(0.02)
    assert progress_mark(zombie.pid) is None  # exited, not reaped yet
    zombie.wait()
    assert progress_mark(zombie.pid) is None
    # only the main thread counts: a process blocked there while another thread works (ZeroMQ's I/O thread taking
    # messages) makes no progress
    side = subprocess.Popen([sys.executable, "-c", SIDE_THREAD])
    try:
        time.sleep(0.5)
        before = progress_mark(side.pid)
        time.sleep(0.5)
        after = progress_mark(side.pid)
        assert before is not None and after is not None
        assert after[1] == before[1] and not after[2]
        total = Path(f"/proc/{side.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(total[11]) + int(total[12]) > after[1]  # the process as a whole did work
    finally:
        side.kill()
        side.wait()
    unwatched = Silence()  # no pid (a peer on another machine): every second of silence counts
    time.sleep(0.3)
    assert unwatched.silent_s() >= 0.3


def test_the_network_server_waits_for_a_busy_coordinator_not_a_stopped_one(
    zmq_pair: Callable[..., tuple[zmq.Socket, zmq.Socket]], spinner: subprocess.Popen[bytes]
) -> None:
    """The coordinator's hello names its pid (here: the spinning child); the server's limit is 1.5 s."""
    router, coord = zmq_pair("net")
    topo = leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us")
    server = NetServer(router, FlowSimulator(topo), "t", {}, 1 << 20)
    coord.send(encode("hello", 0, role="coordinator", token="t", rank=None, world=None, pid=spinner.pid))
    exit_code: list[int] = []
    loop = threading.Thread(target=lambda: exit_code.append(server.serve(1.5)), daemon=True)
    loop.start()
    assert coord.poll(5000) and decode(coord.recv()).type == "welcome"
    loop.join(timeout=3.0)  # twice the limit without a word: the coordinator is busy
    assert loop.is_alive() and server.silence.busy_s > 1.5
    os.kill(spinner.pid, signal.SIGSTOP)
    t_stop = time.monotonic()
    loop.join(timeout=10.0)
    assert exit_code == [4]  # "no word from the coordinator": it left
    assert time.monotonic() - t_stop < 1.5 + 2 * LOOK_S + 1.0
