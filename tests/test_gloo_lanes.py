"""Real mode's first send or receive on a gloo pair does not hold the rank (phantora/runtime/gloo_lanes.py).

gloo connects a pair at its first exchange and blocks that first call until the peer makes its own. A rank used to
make it as it issued the transfer: rank 0's send to rank 2 held rank 0 in gloo while ranks 1 and 2 waited in an
all-reduce whose end the coordinator could not reach without rank 0's clock, and the run hung (torchtitan's
pipeline warm-up vote with FSDP 2 x PP 2, 2026-12-02). On NCCL the send is enqueued and the program runs."""

from __future__ import annotations

import threading
import time

import pytest

from phantora.runtime.gloo_lanes import PairLanes
from tests.test_live_group_order import star3_results

FIRST_SEND = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    tail = dist.new_group([1, 2])
    x = torch.full((4,), float(rank + 1))
    if rank == 0:
        dist.send(x, 2)  # the pair 0-2's first exchange: gloo connects it
    else:
        y = torch.ones(4)
        dist.all_reduce(y, group=tail)  # ranks 1 and 2 first, then rank 2 receives
        if rank == 2:
            dist.recv(x, 0)
    print("RESULT", rank, float(x[0]), flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.slow  # 3 live ranks: 20-30 s wall on the shared machine; the lanes' logic is checked fast below
def test_a_send_whose_receiver_first_waits_in_a_collective_runs(tmp_path) -> None:
    got = star3_results(tmp_path, "first_send.py", FIRST_SEND)
    assert got == [["0", "1.0"], ["1", "2.0"], ["2", "1.0"]]  # rank 2 holds rank 0's ones; rank 1 its own twos


class Work:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait(self) -> bool:
        self.log.append(f"wait {self.name}")
        return True


def test_a_pairs_calls_run_in_order_off_the_thread_until_one_returned() -> None:
    """The first call blocks (gloo's connect) on the lane's thread, not the caller's; a second call to that peer
    queues behind it; another peer's lane runs meanwhile; once a call returned, the pair's calls are direct."""
    lanes, log, gate = PairLanes(timeout_s=10), [], threading.Event()

    def call(name: str, block: bool = False):
        def run() -> Work:
            if block:
                assert gate.wait(10)
            log.append(f"call {name} on {threading.current_thread().name}")
            return Work(log, name)

        return run

    first = lanes.start(2, call("a", block=True))
    second = lanes.start(2, call("b"))
    other = lanes.start(1, call("c"))
    assert other.wait() and log == ["call c on phantora-gloo-lane", "wait c"]
    gate.set()
    assert second.wait() and first.wait()
    assert log[2:] == ["call a on phantora-gloo-lane", "call b on phantora-gloo-lane", "wait b", "wait a"]
    deadline = time.monotonic() + 10
    while lanes._lanes and time.monotonic() < deadline:  # the lane's thread ends once it is empty
        time.sleep(0.01)
    direct = lanes.start(2, call("d"))
    assert isinstance(direct, Work) and log[-1] == "call d on MainThread"


def test_a_call_that_failed_raises_at_its_wait_and_the_pair_stays_on_its_lane() -> None:
    lanes = PairLanes(timeout_s=10)

    def refuse() -> Work:
        raise RuntimeError("Connection closed by peer")

    failed = lanes.start(3, refuse)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        failed.wait()
    again = lanes.start(3, lambda: Work([], "x"))
    assert not isinstance(again, Work) and again.wait()  # on the lane again: the pair never connected


def test_a_call_that_raised_anything_raises_it_at_its_wait_and_the_lane_goes_on() -> None:
    """Not only gloo's RuntimeError: a TypeError (a wrong argument) is raised at the call's wait at once, and the
    pair's next call still runs. Before, the lane's thread died with it: the wait ran out the group's timeout (here
    5 s) and said the pair did not connect, and the calls queued behind it never ran."""
    lanes = PairLanes(timeout_s=5)

    def wrong() -> Work:
        raise TypeError("send(): incompatible function arguments")

    failed = lanes.start(4, wrong)
    later = lanes.start(4, lambda: Work([], "next"))
    t0 = time.monotonic()
    with pytest.raises(TypeError, match="incompatible function arguments"):
        failed.wait()
    assert later.wait() and time.monotonic() - t0 < 4  # neither waited out the 5 s


def test_a_call_that_never_returns_times_out_naming_the_peer() -> None:
    """By its global rank and its rank in the group (gloo's), as a group of global ranks 10-15 knows rank 15."""
    lanes, gate = PairLanes(timeout_s=0.2, ranks=(10, 11, 12, 13, 14, 15)), threading.Event()
    stuck = lanes.start(5, lambda: gate.wait(10) and Work([], "late"))
    with pytest.raises(RuntimeError, match=r"pair with rank 15 \(group rank 5\) in 0.2 s"):
        stuck.wait()
    gate.set()
