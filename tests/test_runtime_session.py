"""The clock semantics of the backend and dispatch mode, in one process.

A one-rank phantora group carries the data over a real one-rank gloo group; the network is a test
double in which every collective takes a fixed time, so each expected time is a closed form of the
roofline (2 n^3 / peak per matmul), that fixed duration and h, the host's launch of an NCCL call
(runtime/nccl_launch.py: on by default, 0 with PHANTORA_NCCL_HOST_LAUNCH=off; every test of the `rig` and `pair`
fixtures runs both ways). The host starts at 0 and a call is issued at max(the compute lane, the host's launch
end): the first at max(t0, h). End-to-end runs with the real bridge are in test_runtime_e2e.py.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.perfmodel.gpus import get_gpu
from phantora.runtime import nccl_launch
from phantora.runtime import session as session_module
from phantora.runtime.backend import PhantoraProcessGroup
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import streams as sim_streams

COMM_NS = 100_000
LAUNCH_NS = 1_000
N = 256
PAST_BUFFER = (1 << 20) // 4 + 1  # fp32 elements: one more than the connection's slots take (P2PClient: 1 MiB)
MM_NS = math.ceil(2 * N**3 / 67e12 * 1e9) + LAUNCH_NS  # fp32 on H100, compute-bound


class FixedLatencyClient:
    """Test double of the bridge client: a collective completes COMM_NS after its issue."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []  # (kind, nbytes, t_issue)
        self.launches: list[tuple[int | None, int | None]] = []  # (stream, launch) of each collective
        self.after: list[list[int]] = []  # the handles each collective starts after
        self.redops: list[str] = []  # the reduction each collective names (Collective.redop)
        self.algos: list[dict[str, Any] | None] = []  # the `algo` map each collective carries
        self.done: dict[int, int] = {}
        self.clock = 0

    def collective(self, *, group: Sequence[int], seq: int, kind: str, nbytes: int, dtype: str, root: Any,
                   t_issue_ns: int, name: str = "", stream: int | None = None,
                   launch: int | None = None, after: Sequence[int] = (), redop: str = "sum",
                   algo: dict[str, Any] | None = None) -> int:  # fmt: skip
        assert t_issue_ns >= self.clock
        self.calls.append((kind, nbytes, t_issue_ns))
        self.algos.append(algo)
        self.redops.append(redop)
        self.launches.append((stream, launch))
        self.after.append(list(after))
        self.done[len(self.done) + 1] = t_issue_ns + COMM_NS
        return len(self.done)

    def p2p(self, **kw: Any) -> int:
        raise AssertionError("no p2p expected")

    def wait(self, handle: int) -> int:
        self.clock = max(self.clock, self.done[handle])
        return self.done[handle]

    def test(self, handle: int, t_now_ns: int) -> int | None:
        return self.done[handle] if self.done[handle] <= t_now_ns else None

    def advance_clock(self, t_ns: int) -> None:
        assert t_ns >= self.clock, "the runtime reported a clock that went back"
        self.clock = t_ns

    def finish(self, t_ns: int, results: dict[str, Any]) -> None:
        self.finished = (t_ns, results)

    def close(self) -> None:
        pass


@pytest.fixture(params=["on", "off"])
def h_ns(request, monkeypatch):
    """The host launch of one NCCL call the sessions made under it charge: on (the default, unset) and opted out."""
    if request.param == "on":
        monkeypatch.delenv(nccl_launch.ENV, raising=False)
    else:
        monkeypatch.setenv(nccl_launch.ENV, "off")
    nccl_launch.enabled.cache_clear()
    request.addfinalizer(nccl_launch.enabled.cache_clear)
    return round(host_launch_us(DEFAULT_BATCHES) * 1000) if request.param == "on" else 0


@pytest.fixture()
def rig(h_ns):
    client = FixedLatencyClient()
    s = RankSession(0, 1, client, Roofline(get_gpu("h100"), LAUNCH_NS), trace_level="ops")
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30), [0], s)
    a = torch.randn(N, N)
    mode = ChargeMode(s)
    with mode:
        yield s, pg, client, a


def test_async_collective_overlaps_compute(rig, h_ns):
    s, pg, client, a = rig
    g = torch.ones(N)
    t0 = s.now()
    work = pg.allreduce([g])
    assert client.calls == [("all_reduce", 4 * N, max(t0, h_ns))]  # issued once the host launched it (an idle GPU)
    assert 10 * MM_NS < COMM_NS
    for _ in range(10):
        a @ a  # independent compute, shorter than the collective
    assert s.now() == max(t0, h_ns) + 10 * MM_NS
    assert not work.is_completed()
    work.wait()
    assert s.now() == max(t0, h_ns) + COMM_NS  # max(compute, comm) from the issue


def test_a_coalescing_blocks_collectives_name_one_group_launch_on_the_groups_stream(rig, h_ns):
    """ProcessGroupNCCL's coalescing (`_start_coalescing` .. `_end_coalescing`) is one NCCL group launch: its
    collectives are sent at the block's end as one coalesced call of the calls' bytes (NCCL's group of them, one
    plan, whatever their kinds): broadcasts of 32 B and 16 B from root 0 and a reduction of 8 B between them are one
    56 B call naming each call's kind, after the matmul between them (NCCL launches at ncclGroupEnd: one host
    launch, so it is issued at max(the matmul's end, h)); it carries the block's launch id, the call after it none;
    both name the group's stream."""
    s, pg, client, a = rig
    x, y, z = torch.ones(8), torch.ones(4), torch.ones(2)
    pg._start_coalescing()
    held = pg.broadcast([x])
    pg.reduce([z])
    a @ a
    pg.broadcast([y])
    assert client.calls == [] and not held._pending and not held.is_completed()  # nothing sent before the end
    t_end = s.now()
    pg._end_coalescing().wait()
    pg.broadcast([x]).wait()
    assert client.calls[0] == ("broadcast", 56, max(t_end, h_ns)) and client.calls[1][:2] == ("broadcast", 32)
    assert client.algos[:2] == [{"group_sizes": [32, 8, 16], "group_kinds": ["broadcast", "reduce", "broadcast"]}, None]
    assert held._pending and held._pending[0].handles == [1]  # the broadcast's work waits for its group's call
    assert held.is_completed()
    (s1, l1), (s2, l2) = client.launches
    assert s1 == s2 is not None
    assert l1 is not None and l2 is None


def test_a_coalescing_blocks_list_all_gathers_of_two_dtypes_are_one_call_of_their_calls(rig):
    """List all-gathers (torch issues them one by one in a device block) of fp32 and bf16 are one all-gather call
    of their outputs' bytes, each call's dtype named (NCCL aggregates them per type, in one launch); the data still
    moves (a one-rank gather copies the input)."""
    s, pg, client, a = rig
    x, y = torch.full((4,), 3.0), torch.full((2,), 5.0, dtype=torch.bfloat16)
    ox, oy = [torch.zeros(4)], [torch.zeros(2, dtype=torch.bfloat16)]
    pg._start_coalescing()
    pg.allgather([ox], [x])
    pg.allgather([oy], [y])
    pg._end_coalescing().wait()
    assert client.calls == [("all_gather", 20, client.calls[0][2])]
    assert client.algos == [{"group_sizes": [16, 4], "group_dtypes": ["fp32", "bf16"]}]
    assert ox[0].tolist() == [3.0] * 4 and oy[0].tolist() == [5.0] * 2


def _sync_all_reduce(pg: PhantoraProcessGroup, g: torch.Tensor) -> None:
    """dist.all_reduce(g, async_op=False) as torch's c10d runs it: asyncOp False, then work.wait() at once."""
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    pg.allreduce([g], opts).wait()


def test_a_sync_collective_on_a_side_stream_holds_up_that_stream_not_the_compute_lane(rig, h_ns, request):
    """ProcessGroupNCCL (torch >= 2.8) runs an async_op=False call on the current stream (FSDP2's all-gather
    stream): c10d's wait does not stall the default stream, whose compute runs on (10 matmuls, MM_NS each); the
    side stream's next collective starts after it (`after`); the default stream's wait_event on the side stream
    joins it: the compute lane ends at max(10 MM_NS, COMM_NS) from the issue (at h: the kernels launched after the
    call start no earlier), as on a GPU; the second call's launch (at 2 h) hides under the matmuls."""
    s, pg, client, a = rig
    session_module.install(s)  # the session the simulated streams and events find, as in a rank
    request.addfinalizer(lambda: session_module.install(None))
    side = sim_streams.Stream()
    g, h = torch.ones(N), torch.ones(N)
    t0 = s.now()
    with sim_streams.stream(side):
        _sync_all_reduce(pg, g)
        done = side.record_event()
    assert s.now() == max(t0, h_ns)  # not + COMM_NS: its wait holds the side stream only
    for _ in range(10):
        a @ a
    assert s.now() == max(t0, h_ns) + 10 * MM_NS
    assert max(t0, h_ns) + 10 * MM_NS >= 2 * h_ns  # the second call's launch ends under the matmuls
    with sim_streams.stream(side):
        _sync_all_reduce(pg, h)
    first = client.after[0]
    assert first == [] and client.after[1] == [1]  # handle 1: the first all-reduce
    assert client.calls[1][2] == max(t0, h_ns) + 10 * MM_NS  # issued at the compute lane's time: its launch hidden
    sim_streams.current_stream().wait_event(done)
    assert s.now() == max(t0, h_ns) + COMM_NS


def test_a_sync_collective_on_the_default_stream_still_joins_the_compute_lane(rig, h_ns):
    s, pg, client, a = rig
    g = torch.ones(N)
    t0 = s.now()
    _sync_all_reduce(pg, g)
    assert s.now() == max(t0, h_ns) + COMM_NS and client.after == [[]]


def test_a_barrier_blocks_the_host_so_the_launch_after_it_shows_and_a_stream_wait_does_not(rig, h_ns):
    """ProcessGroupNCCL's barrier work synchronises the current stream on the host: the host clock moves up to the
    barrier's end, so the next call is issued h after it (each barrier of a loop costs h + its time); an all-reduce's
    wait is a stream wait, the host runs on, and the launch of the call after it hides behind the lane."""
    s, pg, client, a = rig
    x = torch.ones(4)
    t0 = s.now()
    assert COMM_NS > h_ns
    pg.barrier().wait()
    pg.barrier().wait()
    first = max(t0, h_ns)
    assert [c[2] for c in client.calls] == [first, first + COMM_NS + h_ns]
    t_b = first + 2 * COMM_NS + h_ns
    assert s.now() == t_b
    pg.allreduce([x]).wait()
    pg.allreduce([x]).wait()
    assert [c[2] for c in client.calls[2:]] == [t_b + h_ns, t_b + h_ns + COMM_NS]
    assert s.now() == t_b + h_ns + 2 * COMM_NS


class _Disk:
    """A checkpoint storage of the session's own (no bridge): every file takes DISK_NS."""

    host_bps = 1e9
    shared_bps = None

    def lone_ns(self, nbytes: int) -> int:
        return DISK_NS


DISK_NS = 50_000


def test_a_checkpoint_write_holds_the_host_so_the_launch_after_it_shows(rig, h_ns):
    """The host writes the file (a host stall): its clock moves to the write's end, so the next call is issued h
    after it (before, the host clock stayed at 0 and the launch hid behind the write)."""
    s, pg, client, a = rig
    x = torch.ones(4)
    t0 = s.now()
    s.storage_io("ckpt", "write", 1 << 20, _Disk())
    assert s.now() == t0 + DISK_NS
    pg.allreduce([x]).wait()
    assert client.calls[0][2] == t0 + DISK_NS + h_ns


def test_compute_longer_than_comm_hides_it(rig, h_ns):
    s, pg, client, a = rig
    g = torch.ones(N)
    t0 = s.now()
    work = pg.allreduce([g])
    assert 80 * MM_NS > COMM_NS
    for _ in range(80):
        a @ a
    assert work.is_completed()
    work.wait()
    assert s.now() == max(t0, h_ns) + 80 * MM_NS  # the collective (issued at max(t0, h)) finished first: no stall


def test_reading_a_collectives_output_waits_for_it(rig, h_ns):
    s, pg, client, a = rig
    g = torch.full((N,), 2.0)
    t0 = s.now()
    pg.allreduce([g])  # never waited on explicitly; issued at h
    a @ a  # unrelated: no wait
    assert s.now() == max(t0, h_ns) + MM_NS
    y = g[:8] * 3  # reads a view of the output: joins first, then runs
    mul_ns = math.ceil((8 * 4 + 8 * 4) / 3.35e12 * 1e9) + LAUNCH_NS
    assert s.now() == max(t0, h_ns) + COMM_NS + mul_ns
    assert torch.equal(y, torch.full((8,), 6.0))  # one rank: SUM leaves the data unchanged


def test_avg_is_sum_then_divide_and_step_syncs(rig, h_ns):
    s, pg, client, a = rig
    g = torch.full((4,), 3.0)
    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.AVG
    t0 = s.now()
    pg.allreduce([g], o)
    assert s.step() == max(t0, h_ns) + COMM_NS  # step() joins everything in flight
    assert torch.equal(g, torch.full((4,), 3.0))
    assert s.results()["step_ends_ns"] == [max(t0, h_ns) + COMM_NS]
    assert client.redops[-1] == "avg"  # what NCCL's model is told: NCCL's own ncclAvg, not gloo's sum


def test_sizes_follow_nccl_tests_convention(rig):
    s, pg, client, a = rig
    x = torch.ones(16)
    out = torch.empty(16)
    pg.all_gather_single(out, x).wait()
    pg.reduce_scatter_single(out, x).wait()
    pg.broadcast([x]).wait()
    pg.barrier().wait()
    kinds = [(k, b) for k, b, _ in client.calls]
    # a barrier goes to the network as ProcessGroupNCCL runs it: an all-reduce of one float (4 B)
    assert kinds == [("all_gather", 64), ("reduce_scatter", 64), ("broadcast", 64), ("all_reduce", 4)]
    assert s.comm["barrier"].count == 1 and s.comm["barrier"].nbytes == 0  # counted as the program's barrier


def test_virtual_time_is_deterministic():
    def run() -> list[int]:
        client = FixedLatencyClient()
        s = RankSession(0, 1, client, Roofline(get_gpu("a100")), trace_level="none")
        pg = PhantoraProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30), [0], s)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        with ChargeMode(s):
            for _ in range(3):
                model(torch.randn(16, 32)).sum().backward()
                for p in model.parameters():
                    pg.allreduce([p.grad])
                s.step()
        return s.step_ends

    first = run()
    assert first == run() and len(first) == 3 and first[0] > 0


def test_premul_sum_is_the_scaled_sum(rig):
    """NCCL's PREMUL_SUM (FSDP2's reduce-scatter with a divide factor): factor x the sum, over 1 rank."""
    s, pg, client, a = rig
    g = torch.full((4,), 3.0)
    o = dist.AllreduceOptions()
    o.reduceOp = dist._make_nccl_premul_sum(0.25)
    pg.allreduce([g], o).wait()
    assert g.tolist() == [0.75] * 4


class _Log:
    """A SessionListener that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_compute(self, name: str, start_ns: int, duration_ns: int) -> None:
        self.events.append(("compute", start_ns, duration_ns))

    def on_issue(self, call: Any) -> None:
        self.events.append(("issue", call.kind, call.nbytes, call.t_issue_ns, call.handle))

    def on_wait(self, handles: Sequence[int], t_done_ns: int) -> None:
        self.events.append(("wait", tuple(handles), t_done_ns))

    def on_step(self, index: int, end_ns: int) -> None:
        self.events.append(("step", index, end_ns))

    def on_finish(self, end_ns: int) -> None:
        self.events.append(("finish", end_ns))


def test_a_listener_is_told_each_op_issue_wait_step_and_the_finish_in_order(rig, h_ns):
    s, pg, client, a = rig
    log = _Log()
    s.add_listener(log)
    a @ a  # one matmul: MM_NS from 0
    pg.allreduce([a]).wait()  # issued at max(MM_NS, h), done COMM_NS later; the compute lane waits for it
    s.step()
    s.finish()
    computes = [e for e in log.events if e[0] == "compute"]
    assert computes[0] == ("compute", 0, MM_NS)
    issued = max(MM_NS, h_ns)
    issue = next(e for e in log.events if e[0] == "issue")
    assert issue[1:4] == ("all_reduce", N * N * 4, issued)
    wait = next(e for e in log.events if e[0] == "wait")
    assert wait == ("wait", (issue[4],), issued + COMM_NS)
    kinds = [e[0] for e in log.events]
    assert kinds.index("issue") < kinds.index("wait") < kinds.index("step") < kinds.index("finish") == len(kinds) - 1
    end = issued + COMM_NS + sum(e[2] for e in computes[1:])  # ops after the wait (if any) run after it
    assert ("step", 0, end) in log.events and log.events[-1] == ("finish", end)


def test_a_job_that_starts_later_and_stops_after_its_steps() -> None:
    """A job of a multi-job run: its clock starts at start_ns, its first step is timed from there, and the
    script ends (StepLimitReached, a SystemExit with code 0) once max_steps steps are done."""
    from phantora.runtime.session import StepLimitReached

    client = FixedLatencyClient()
    s = RankSession(0, 1, client, Roofline(get_gpu("h100"), LAUNCH_NS), trace_level="none", start_ns=5_000_000,
                    max_steps=2)  # fmt: skip
    a = torch.randn(N, N)
    with ChargeMode(s):
        a @ a
        assert s.step() == MM_NS  # from the start, not from 0
        a @ a
        with pytest.raises(StepLimitReached) as stop:
            s.step()
    assert stop.value.code == 0
    assert s.step_ends == [5_000_000 + MM_NS, 5_000_000 + 2 * MM_NS]
    assert s.results()["start_ns"] == 5_000_000


class P2PClient(FixedLatencyClient):
    """The fixed-latency double, with sends and receives: each completes COMM_NS after its issue too."""

    def __init__(self) -> None:
        super().__init__()
        self.p2ps: list[dict[str, Any]] = []  # what each send/recv named: peer, send, stream, launch, after, handle

    def p2p(self, *, peer: int, is_send: bool, t_issue_ns: int, stream: int | None = None,
            launch: int | None = None, after: Sequence[int] = (), **_: Any) -> int:  # fmt: skip
        self.done[len(self.done) + 1] = t_issue_ns + COMM_NS
        h = len(self.done)
        self.p2ps.append({"peer": peer, "send": is_send, "stream": stream, "launch": launch, "after": list(after),
                          "h": h})  # fmt: skip
        return h

    def handoff_plan(self, *, peer: int, nbytes: int, algo: Any = None) -> tuple[None, list[int], bool]:
        """No hand-off time, and the slots of one net channel of 128 KiB steps (leaf_spine(1, 2, 1)'s pair:
        8 of them, 1 MiB): a larger send waits for its receiver on its stream."""
        return None, [max(1, -(-nbytes // (128 * 1024)))], True


@pytest.fixture()
def pair(request, h_ns):
    """Rank 0 of a 2-rank group in phantom mode (no data moves, so no peer process is needed)."""
    client = P2PClient()
    s = RankSession(0, 2, client, Roofline(get_gpu("h100"), LAUNCH_NS), trace_level="none", phantom=True)
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 2, datetime.timedelta(seconds=30), [0, 1], s)
    session_module.install(s)  # the session the simulated streams and events find, as in a rank
    request.addfinalizer(lambda: session_module.install(None))
    with ChargeMode(s):
        yield s, pg, client, torch.randn(N, N)


def test_a_sync_send_on_a_side_stream_holds_up_that_stream_not_the_compute_lane(pair, h_ns):
    """dist.send (isend, then Work.wait on the current stream) from a side stream, as a pipeline stage's send
    stream does: ProcessGroupNCCL runs it on the peer pair's own stream after the side stream's work, and the wait
    makes the side stream, not the default one, wait for it. The compute lane runs on (10 matmuls); the side
    stream's next collective starts after the send (`after`); the default stream's wait_event on the side stream
    ends at the send's end, t0 + h + COMM_NS (issued once the host launched it; before: the send joined the compute
    lane at once)."""
    s, pg, client, a = pair
    side = sim_streams.Stream()
    x, g = torch.ones(PAST_BUFFER), torch.ones(N)
    t0 = s.now()
    with sim_streams.stream(side):
        pg.send([x], 1).wait()
        done = side.record_event()
    assert s.now() == max(t0, h_ns)
    (send,) = client.p2ps
    assert send["stream"] not in (None, pg._stream) and send["launch"] is None and send["after"] == []
    for _ in range(10):
        a @ a
    assert s.now() == max(t0, h_ns) + 10 * MM_NS
    with sim_streams.stream(side):
        _sync_all_reduce(pg, g)
    assert client.after == [[send["h"]]]
    sim_streams.current_stream().wait_event(done)
    assert s.now() == max(t0, h_ns) + COMM_NS


def test_lone_sends_run_on_their_pairs_stream_after_the_current_streams_work(pair):
    """A lone send and recv with one peer share the pair's stream (one 2-rank communicator); each starts after
    what its current stream waits for: a send after a sync all-reduce on the same side stream names it."""
    s, pg, client, a = pair
    side = sim_streams.Stream()
    with sim_streams.stream(side):
        _sync_all_reduce(pg, torch.ones(N))
        pg.send([torch.ones(PAST_BUFFER)], 1)
        pg.send([torch.ones(N)], 1)
    pg.recv([torch.ones(N)], 1)
    send, small, recv = client.p2ps
    assert send["stream"] == recv["stream"] != pg._stream
    assert send["after"] == [1] and recv["after"] == []  # handle 1: the all-reduce; the default stream waits on none
    # a send its connection buffers ends before its receive starts (NCCL's sender waits only for a free slot): on
    # its pair's stream, which holds it behind the calls before it there and holds the calls after it only until its
    # hand-off (`handoff`), so two ranks that both send first do not deadlock (tests/test_eager_send.py)
    assert small["stream"] == send["stream"] and small["after"] == [1]


def test_a_batch_of_sends_and_recvs_is_one_launch_on_the_groups_stream(pair):
    """batch_isend_irecv: ProcessGroupNCCL runs the batch on the group's communicator and stream, one NCCL group
    launch; a lone send after it goes back to the pair's stream."""
    from types import SimpleNamespace

    from phantora.runtime.backend import _grouped_batch

    s, pg, client, a = pair
    x, y = torch.ones(N), torch.ones(N)
    batch = _grouped_batch(lambda ops: [pg.send([x], 1), pg.recv([y], 1)])
    batch([SimpleNamespace(group=pg)])
    pg.send([x], 1)
    first, second, lone = client.p2ps
    assert first["stream"] == second["stream"] == pg._stream
    assert first["launch"] == second["launch"] is not None and lone["launch"] is None
    assert lone["stream"] != pg._stream


def test_an_uneven_all_to_all_is_one_launch_of_transfers_on_the_groups_stream(pair):
    """ProcessGroupNCCL runs an uneven all-to-all as ncclSend/ncclRecv between one group start and end: its
    transfers carry one launch on the group's stream; a sync one on a side stream holds that stream's next call."""
    s, pg, client, a = pair
    side = sim_streams.Stream()
    out, inp = torch.empty(3, 4), torch.ones(5, 4)
    opts = dist.AllToAllOptions()
    opts.asyncOp = False
    with sim_streams.stream(side):
        pg.alltoall_base(out, inp, [1, 2], [2, 3], opts).wait()
        _sync_all_reduce(pg, torch.ones(N))
    send, recv = client.p2ps
    assert send["stream"] == recv["stream"] == pg._stream and send["launch"] == recv["launch"] is not None
    assert client.after == [[send["h"], recv["h"]]]


def test_a_wrapper_tensor_has_no_storage_key(rig):
    """A wrapper subclass (no data of its own: its storage is invalid, its data_ptr raises) has no storage to join
    by: `wait_tensor` on one while collectives are in flight joined nothing, and no longer raises (torchtitan's
    deepseek_v3 EP run stopped at token_dispatcher.py:289 on this at 42a9207)."""
    from phantora.runtime.session import storage_key

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, elem: torch.Tensor) -> Wrapper:
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    s, pg, client, a = rig
    w = Wrapper(torch.ones(3))
    with pytest.raises(RuntimeError, match="invalid python storage"):
        w.untyped_storage().data_ptr()
    assert storage_key(w) is None
    pg.allreduce([torch.ones(N)])  # in flight: by_storage is not empty
    t0 = s.now()
    s.join_tensors([w])
    assert s.by_storage and s.now() == t0


class PlansClient(P2PClient):
    """The p2p double that answers a group end's plans (bridge `group_plans`) with a fixed count."""

    def __init__(self, plans: int) -> None:
        super().__init__()
        self.plans = plans
        self.asked: list[tuple[list[int], list[list[Any]]]] = []

    def group_plans(self, *, comm: Sequence[int], ops: Sequence[Sequence[Any]], algo: Any = None) -> int:
        self.asked.append((list(comm), [list(op) for op in ops]))
        return self.plans


def test_a_groups_host_pays_a_launch_for_each_further_plan(request, h_ns):
    """A coalescing block of two sends to rank 1 and a receive from it (NCCL 2.22+ plans them at ncclGroupEnd;
    the client says 3 plans here): the host pays the group's launch h at its first call and 4.26 us, host_launch.py's
    per-call part, for each further plan's kernel; opted out, nothing and no question. A block of one operation a
    peer and side (one plan, as the coordinator cuts) asks nothing."""
    from phantora.collectives.nccl.host_launch import HOST_LAUNCH_US

    client = PlansClient(3)
    s = RankSession(0, 2, client, Roofline(get_gpu("h100"), LAUNCH_NS), trace_level="none", phantom=True)
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 2, datetime.timedelta(seconds=30), [0, 1], s)
    session_module.install(s)
    request.addfinalizer(lambda: session_module.install(None))
    with ChargeMode(s):
        host0 = s.host_ns
        pg._start_coalescing()
        pg.send([torch.ones(N)], 1)
        pg.send([torch.ones(N)], 1)
        pg.recv([torch.ones(N)], 1)
        pg._end_coalescing()
        if not h_ns:
            assert client.asked == [] and s.host_ns == host0 and s.nccl_launches == 0
            return
        assert client.asked == [([0, 1], [[1, 4 * N, True], [1, 4 * N, True], [1, 4 * N, False]])]
        assert s.host_ns - host0 == h_ns + 2 * round(HOST_LAUNCH_US * 1000)
        assert s.nccl_launches == 3
        pg._start_coalescing()
        pg.send([torch.ones(N)], 1)
        pg.recv([torch.ones(N)], 1)
        pg._end_coalescing()
    assert len(client.asked) == 1 and s.nccl_launches == 4
