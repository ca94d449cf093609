"""Real data: a lone send that hands off copies its tensors only if its receive is not issued yet
(runtime/session.py `issue_p2p`'s `start_copied`, runtime/backend.py `_handed`).

The data moves over gloo, which reads a send's tensor only once the receiver's recv is posted (a rendezvous), and a
rank waiting in gloo would stall the coordinator, so each send is posted at its issue. A send that hands off lets
its caller overwrite the tensor once its wait returns: NCCL's kernel has left the bytes in its connection's slots by
then. So a send whose receive is already issued moves the caller's tensor, taken before its wait returns (the
receiver's recv is posted, so that cannot hang); one handed off before its receive moves a copy made at its issue.

`PHASES` on two one-GPU hosts with 256 KiB sends (within the one channel's 1 MiB), and on testbed16's GPUs 0 and 1
with 16 MiB: rank 1 issues a receive, then both ranks pass a barrier, then rank 0 sends x1 (the receive was in: no
copy), overwrites it, sends x2 and overwrites it, and only then passes a second barrier, after which rank 1 issues
the receive of x2 (x2 handed off first: one copy, of its bytes). Rank 1 gets 1.0 and 2.0 in every element, what
rank 0 sent, not the -1.0 written after each wait.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
MIB = 1024 * KIB

PHASES = """
    import sys, torch, torch.distributed as dist
    from phantora.runtime import session
    n = int(sys.argv[1])
    dist.init_process_group()
    r = dist.get_rank()
    if r == 0:
        x1, x2 = torch.full((n,), 1.0), torch.full((n,), 2.0)
        dist.barrier()
        dist.send(x1, 1)  # its receive was issued before the barrier: moved from x1, no copy
        x1.fill_(-1.0)
        dist.send(x2, 1)  # its receive comes after the second barrier: copied at its issue
        x2.fill_(-1.0)
        dist.barrier()
    else:
        b1, b2 = torch.zeros(n), torch.zeros(n)
        q = dist.irecv(b1, 0)
        dist.barrier()
        q.wait()
        dist.barrier()
        dist.recv(b2, 0)
        print("GOT", float(b1.min()), float(b1.max()), float(b2.min()), float(b2.max()), flush=True)
    s = session.current()
    print("COPIES", s.handoff_copies, s.handoff_copy_bytes, flush=True)
    dist.destroy_process_group()
"""


def _line(log: str, key: str) -> list[float]:
    return [float(v) for v in next(x for x in log.splitlines() if x.startswith(key)).split()[1:]]


@pytest.mark.parametrize(
    ("topo", "floats", "copied"),
    [
        ("cross", 64 * KIB, 262_144),  # 256 KiB across one network channel
        ("testbed16", 4 * MIB, 16_777_216),  # 16 MiB over NVLink (2 of 8 slots on each of 16 channels): large enough
        # that, were x1 not taken before its wait returned, the overwrite would reach rank 1 (seen: b1's min -1.0)
    ],
)
def test_a_send_copies_only_if_handed_off_before_its_receive_and_the_receiver_gets_the_sent_values(
    tmp_path: Path, topo: str, floats: int, copied: int
):
    script = tmp_path / "phases.py"
    script.write_text(textwrap.dedent(PHASES))
    net = leaf_spine(1, 2, 1, nic_rate="100Gbps") if topo == "cross" else load_topology(topo)
    rep = launch(RunConfig(str(script), [str(floats)], topology=net, nproc=2, trace="none", timeout_s=240))
    assert _line(rep.logs["rank 1"], "GOT") == [1.0, 1.0, 2.0, 2.0]
    assert _line(rep.logs["rank 0"], "COPIES") == [1, 4 * floats] == [1, copied]
    assert _line(rep.logs["rank 1"], "COPIES") == [0, 0]


def test_the_coordinator_says_a_receive_is_issued_only_while_it_waits_for_its_send():
    """`Matcher.recv_issued`, behind the `handoff` reply's `ready`: True once rank 1's receive of (0, 1, tag 3, seq 0)
    is in and rank 0's send is not; False for another seq, once the send is in, and for a send that came first."""
    from bridge.matching import Call, Matcher

    m = Matcher(2)
    recv = Call(1, 1, "recv", 4, "uint8", None, 0)
    send = Call(0, 1, "send", 4, "uint8", None, 0)
    assert not m.recv_issued(0, 1, 3, 0)
    assert m.transfer(recv, 0, 3, 0, False) is None
    assert m.recv_issued(0, 1, 3, 0) and not m.recv_issued(0, 1, 3, 1) and not m.recv_issued(1, 0, 3, 0)
    assert m.transfer(send, 1, 3, 0, True) is not None
    assert not m.recv_issued(0, 1, 3, 0)
    assert m.transfer(Call(0, 2, "send", 4, "uint8", None, 0), 1, 3, 1, True) is None
    assert not m.recv_issued(0, 1, 3, 1)  # the send is in first: no receive is waiting


AHEAD = """
    import sys, time, torch, torch.distributed as dist
    from phantora.runtime import session
    n, k = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group()
    r = dist.get_rank()
    s = session.current()
    copies = getattr(s, "send_copies", None)

    def held():  # the bytes of the send copies alive
        if copies is not None:
            return copies.held_bytes()
        return sum(p.nbytes for p in s.pending.values() if p.kind == "send" and p.inner)  # before: in their gloo works

    def settled():  # held() once the thread that frees a taken copy has run (at most 10 s)
        end = time.monotonic() + 10
        while held() and time.monotonic() < end:
            time.sleep(0.001)
        return held()

    x = torch.zeros(n)
    works, at_issue, after = [], [], []
    for i in range(k):
        if r == 0:
            x.fill_(float(i))
            w = dist.isend(x, 1)  # handed off before its receive is issued: copied
            if i % 2 == 0:
                w.wait()  # as dist.send does: it returns at the hand-off
            else:
                works.append(w)  # kept, waited only at the end
            x.fill_(-1.0)  # the program reuses its buffer at once
            at_issue.append(held())
            dist.barrier()
            dist.barrier()  # rank 1 received send i in between
            after.append(settled())
        else:
            dist.barrier()
            dist.recv(x, 0)
            assert float(x.min()) == float(x.max()) == float(i), (i, float(x.min()), float(x.max()))
            dist.barrier()
    for w in works:
        w.wait()
    if r == 0:
        print("ISSUE", *at_issue, flush=True)
        print("AFTER", *after, flush=True)
        print("PEAK", copies.peak_bytes if copies is not None else max(at_issue), flush=True)
    dist.destroy_process_group()
"""


def test_a_copy_is_freed_once_its_receive_took_it_whatever_the_sender_does_with_its_work(tmp_path: Path):
    """`AHEAD` on testbed16's GPUs 0 and 1 (one NVLink slot on each of 4 channels a send): rank 0 sends 4 x 256 KiB,
    each before rank 1 issues its receive (so each is copied), and overwrites its buffer after each; it waits the even
    ones at their hand-off (as dist.send does) and keeps the odd ones' works, waited at the end. Rank 1 receives each
    between two barriers. The copies alive are at most those not yet received: one send's 262,144 bytes at each
    issue, none once its receive is done, a peak of 262,144 (send_copies.py's weak references: memory alive, not
    bookkeeping). Before, each copy lived in its gloo work until its send's completion was learned (a later send
    waiting for its slots, or the end): i + 1 copies at send i's issue here, 8 from the 8th send on. Rank 1 gets
    each send's values, not the -1 written after."""
    script = tmp_path / "ahead.py"
    script.write_text(textwrap.dedent(AHEAD))
    k, floats = 4, 64 * KIB
    cfg = RunConfig(str(script), [str(floats), str(k)], topology=load_topology("testbed16"), nproc=2, trace="none")
    log = launch(cfg).logs["rank 0"]
    one = 4 * floats
    assert one == 262_144
    assert _line(log, "ISSUE") == [one] * k
    assert _line(log, "AFTER") == [0] * k
    assert _line(log, "PEAK") == [one]
