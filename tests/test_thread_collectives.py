"""An NCCL collective issued from a thread the program started (session.py `_thread_issue`, host_clocks.py): real
torch.distributed on 2 ranks of one H100 host (testbed16), the default group's all-reduce of 4 MiB from a
`threading.Thread`, on the default stream or a side stream.

The thread times it with its own events on its stream: the call's host launch (from a synchronise, the GPU idle)
and NCCL's Simple ring on two H100s, written out in tests/test_backend_identity.py (`ring_all_reduce_ns`: 38.34 us)
after the host's 4.26 us + 24 x 32 ns launch: 43.37 us, on either stream's lane. In real mode the data is gloo's:
each rank's tensor equals gloo's all-reduce of the same values. A rank whose thread all-reduces while the other
rank's program broadcasts at the same place breaks NCCL's contract (every rank issues a communicator's calls in
one order): the run stops on the coordinator's mismatch, naming each rank's call and the thread that issued it.

Two communicators crossed between a thread and the program (scripts/thread_cross_groups.py): rank 0's thread
all-reduces on group G1 and waits while rank 0's program must all-reduce on group G2, which rank 1's program does
and synchronises on before its thread all-reduces on G1. Real NCCL runs it; the thread's wait must not hold the
rank's calls up (before, it held the coordinator client: "deadlock at 0 ns"). From an event before both, after a
kernel and a synchronise of K ns on each rank: G2's ends at K + (launch + ring), G1's at K + 2 (launch + ring) (rank
1's thread launches it after G2's end), on both ranks.

A thread's send and receive (scripts/thread_p2p.py): on a side stream busy with a kernel of K ns (its events), rank
0's thread isends 1 MiB to rank 1, whose thread irecvs it, each waiting. Issued at that stream's lane, the send
hands off K + 8.4 + 3.4 us + 1 MiB / (16 x 20.6 GB/s) = K + 14,981 ns after the thread's first event, the receive
ends with NCCL's lone p2p inside the host, K + 14,982 (whole ns, rounded up; tests/test_handoff_zero_copy.py).
Before, they were issued as the program's thread's, at its compute lane: both ended at K.

A thread's host waiting for the device (scripts/thread_sync_wait.py, both ranks alike): on a side stream a kernel of
K ns, then an all-reduce of 4 MiB (ring R, launch L hidden behind the kernel: it runs K to K + R), which the thread
either does not wait for but `torch.cuda.synchronize()`s after, or waits for with a timeout (that stream's next
event at K + R); then it all-reduces on a second side stream, launched from its host clock, which the wait left at
K + R: that ends at K + R + L + R. Before, the synchronise waited for nothing and the wait with a timeout joined the
compute lane and moved the program's host clock: the second all-reduce ended at K + 2 R, the event at K.

A thread's synchronise waits only for the work launched before it (scripts/thread_sync_later.py): rank 0's thread
waits for its all-reduce of x while its program runs ahead and launches a long kernel; rank 1's program all-reduces
x after a kernel of K ns (each rank's), so x ends at K + L + R; the thread then synchronises and all-reduces y on
another side stream, which rank 1 launches after x's end: y ends at K + 2 (L + R) on both ranks, before the long
kernel ends. Before, the thread's synchronise waited for the long kernel too (y ended after it).

A thread's stream or event synchronise waits for that stream's or event's work alone (scripts/thread_stream_sync.py,
each rank alike): a thread launches a kernel of B ns on the compute lane, then one of K ns on a side stream, and
synchronises the device, that stream or its event there; then it runs the short kernel on another side stream. The
device's ends it at B + K; the stream's and the event's at the long kernel's host launch + 2 K. Before, both waited
as the device's.

A thread's wait tells the coordinator a time past the program's compute lane (the program was joining the thread);
the program's next calls are stamped no earlier (scripts/thread_then_recv_any.py: a receive from any source on a
gloo group stopped the run before, "recv stamped 4110 ns, before the rank's clock (47478 ns)").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, HOST_CHANNEL_US, HOST_LAUNCH_US
from phantora.errors import PhantoraError
from phantora.launcher import RunConfig, launch
from phantora.rank_options import DEFAULT_LAUNCH_NS
from tests.test_backend_identity import SIZE, ring_all_reduce_ns
from tests.test_handoff_zero_copy import NVL_HANDOFF, NVL_TRANSFER

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LAUNCH_NS = 1000 * (HOST_LAUNCH_US + HOST_CHANNEL_US * DEFAULT_BATCHES)  # the host's launch of one NCCL call


def run(
    tmp: Path, where: str | None, tensors: str = "real", script: str = "thread_collective.py"
) -> list[dict[str, Any]]:
    seen = tmp / "seen"
    seen.mkdir()
    args = [str(seen)] + ([where] if where else []) + (["phantom"] if tensors == "phantom" else [])
    launch(RunConfig(str(SCRIPTS / script), args, "testbed16", nproc=2, tensors=tensors, trace="none",
                     out_dir=tmp / "run", timeout_s=300))  # fmt: skip
    return [json.loads((seen / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(("where", "tensors"), [("default", "real"), ("side", "real"), ("side", "phantom")])
def test_a_threads_all_reduce_moves_glooss_values_in_the_ring_time_on_its_lane(
    tmp_path: Path, where: str, tensors: str
) -> None:
    want_ns = ring_all_reduce_ns(2, SIZE) + LAUNCH_NS
    for seen in run(tmp_path, where, tensors):
        assert seen["ns"] == pytest.approx(want_ns, abs=1)  # whole ns
        if tensors == "real":
            assert seen["equal"] is True and seen["value"] == 1.0 + 2.0


def test_a_thread_and_a_program_crossing_their_calls_stop_the_run_naming_both(tmp_path: Path) -> None:
    with pytest.raises(PhantoraError) as err:
        run(tmp_path, "crossed")
    text = str(err.value)
    assert "collective mismatch on group [0, 1] seq 0" in text
    assert """rank 0 called all_reduce 'all_reduce#0 from thread "background all-reduce"'""" in text
    assert "rank 1 called broadcast 'broadcast#0 from the program's thread'" in text


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_threads_wait_on_one_group_lets_the_programs_call_on_another_go_on(tmp_path: Path, tensors: str) -> None:
    one = ring_all_reduce_ns(2, SIZE) + LAUNCH_NS
    for seen in run(tmp_path, None, tensors, "thread_cross_groups.py"):
        k = seen["K"]
        assert k > 2 * one  # rank 0's thread is in G1's wait before its program's G2 call
        assert seen["B"] == pytest.approx(k + one, abs=1)
        assert seen["A"] == pytest.approx(k + 2 * one, abs=2)
        if tensors == "real":
            assert seen["equal"] == [True, True] and seen["values"] == [1.0 + 2.0, 10.0 + 20.0]


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_threads_send_and_receive_start_on_its_streams_lane(tmp_path: Path, tensors: str) -> None:
    sender, receiver = run(tmp_path, None, tensors, "thread_p2p.py")
    assert sender["ns"] == sender["K"] + NVL_HANDOFF
    assert receiver["ns"] == receiver["K"] + NVL_TRANSFER
    if tensors == "real":
        assert receiver["equal"] is True and receiver["value"] == 1.0


@pytest.mark.parametrize(("mode", "tensors"), [("sync", "real"), ("timeout", "real"), ("sync", "phantom")])
def test_a_threads_synchronise_and_timed_wait_hold_its_host_until_the_device_is_done(
    tmp_path: Path, mode: str, tensors: str
) -> None:
    ring = ring_all_reduce_ns(2, SIZE)
    for seen in run(tmp_path, mode, tensors, "thread_sync_wait.py"):
        k = seen["K"]
        assert k > LAUNCH_NS  # the first all-reduce's launch is hidden behind the kernel
        assert seen["ns"] == pytest.approx(k + 2 * ring + LAUNCH_NS, abs=2)
        if mode == "timeout":
            assert seen["wait"] == pytest.approx(k + ring, abs=1)
        if tensors == "real":
            assert seen["values"] == [1.0 + 2.0, 10.0 + 20.0]


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_threads_synchronise_does_not_wait_for_work_the_program_launched_after_it(
    tmp_path: Path, tensors: str
) -> None:
    one = ring_all_reduce_ns(2, SIZE) + LAUNCH_NS
    ranks = run(tmp_path, None, tensors, "thread_sync_later.py")
    assert ranks[0]["K"] == ranks[1]["K"]
    long_end = ranks[0]["long"]
    for seen in ranks:
        assert seen["ns"] == pytest.approx(seen["K"] + 2 * one, abs=2)
        assert seen["ns"] < long_end  # the program's later kernel is not waited for
        if tensors == "real":
            assert seen["values"] == [1.0 + 2.0, 10.0 + 20.0]


@pytest.mark.parametrize("mode", ["device", "stream", "event"])
def test_a_threads_stream_or_event_synchronise_waits_for_its_work_alone(tmp_path: Path, mode: str) -> None:
    for seen in run(tmp_path, mode, "real", "thread_stream_sync.py"):
        k, b = seen["K"], seen["B"]
        assert b > 2 * k + DEFAULT_LAUNCH_NS
        if mode == "device":  # the long kernel, launched before, then the short one from the synchronise
            assert seen["ns"] == b + k
        else:  # the short one on its side stream from the long one's host launch, then the other
            assert seen["ns"] == DEFAULT_LAUNCH_NS + 2 * k


def test_the_programs_calls_after_a_threads_wait_are_stamped_no_earlier(tmp_path: Path) -> None:
    receiver, _ = run(tmp_path, None, "real", "thread_then_recv_any.py")
    assert receiver == {"src": 1, "got": [7.0] * 4}
