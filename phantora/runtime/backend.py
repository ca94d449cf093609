"""The `phantora` torch.distributed backend: a ProcessGroup whose collectives are simulated.

Each call does two things. It tells the bridge about the collective (kind, group, bytes, issue
time = the compute lane's time), so the network simulator decides when it completes. And it
starts the same collective on an inner gloo group, so the real data moves and results equal a
gloo run (real mode). The returned `PhantoraWork` is asynchronous: `wait()` joins the virtual
clock's lanes at the simulated completion. In phantom mode (`phantom_mode.py`) tensors are meta and
there is no gloo half: nothing moves, and the group needs no peer processes at all.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    PrefixStore,
    ProcessGroupGloo,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from torch.futures import Future

from bridge.client import WaitTimedOut
from phantora.errors import InputError, PhantoraError
from phantora.perfmodel.dtypes import short_dtype
from phantora.runtime import gloo_cost, mirror_groups, tensor_values
from phantora.runtime import session as _session
from phantora.runtime.coalesce_block import GROUPED, HeldCall, merged
from phantora.runtime.gloo_lanes import PairLanes
from phantora.runtime.gloo_thread import GlooOnlyWork, off_thread
from phantora.runtime.program_env import program_nccl_env
from phantora.runtime.session import Pending, RankSession, Transfer
from phantora.runtime.simcuda import device as simcuda
from phantora.runtime.simcuda import nccl_surface
from phantora.runtime.simcuda import streams as sim_streams
from phantora.runtime.simcuda.tensor import SimCudaTensor
from phantora.runtime.unowned_gloo import UnownedGloo

BACKEND = "phantora"
CUDA_NAME = "nccl"  # what a phantora group calls itself: the backend of the CUDA requests it serves
GLOO_NAME = "gloo"  # a plain gloo group's name (`gloo_sync`), as ProcessGroupGloo's
ReduceOp = dist.ReduceOp

_DTYPES: dict[torch.dtype, str] = {}  # the short names of the dtypes seen so far


def dtype_name(t: torch.Tensor) -> str:
    """The bridge's dtype name of a tensor (fp8 types -> 'fp8'; anything else counts as bytes)."""
    name = _DTYPES.get(t.dtype)
    if name is None:
        name = _DTYPES[t.dtype] = short_dtype(t.dtype)
    return name


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _call_sizes(calls: Sequence[Sequence[torch.Tensor]]) -> tuple[int, ...]:
    """The bytes of each NCCL call of a coalesced call (ProcessGroupNCCL's `collectiveCoalesced`: one ncclAllReduce,
    ncclAllGather or ncclReduceScatter a tensor, in one NCCL group); () for one call (a lone collective)."""
    return tuple(nbytes(c) for c in calls) if len(calls) > 1 else ()


def _call_dtypes(calls: Sequence[Sequence[torch.Tensor]]) -> tuple[str, ...]:
    """Each NCCL call's dtype of a coalesced call where they differ (NCCL aggregates a group's calls per type);
    () where all are the first's."""
    names = tuple(dtype_name(c[0]) for c in calls if c)
    return names if len(set(names)) > 1 and len(names) == len(calls) else ()


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    out: list[torch.Tensor] = []
    for item in x:
        out.extend(_flat(item))
    return out


def _reduce_op(opts: Any) -> Any:
    """The reduce op of an options object, or a bare ReduceOp (the single-tensor overloads)."""
    if opts is None:
        return ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


_REDOPS = (
    (ReduceOp.SUM, "sum"),
    (ReduceOp.AVG, "avg"),
    (ReduceOp.PREMUL_SUM, "mulsum"),
    (ReduceOp.PRODUCT, "prod"),
    (ReduceOp.MIN, "min"),
    (ReduceOp.MAX, "max"),
    (ReduceOp.BAND, "band"),
    (ReduceOp.BOR, "bor"),
    (ReduceOp.BXOR, "bxor"),
)


def redop_name(op: Any, t: torch.Tensor) -> str:
    """The reduction NCCL runs for `op` on `t` (Collective.redop): ProcessGroupNCCL's own, which on bool tensors
    (NCCL's uint8) runs a sum as max and a product as min."""
    name = next((n for o, n in _REDOPS if op == o), None)
    if name is None:
        raise InputError(f"reduce op {op!r} is not one phantora knows ({', '.join(n for _, n in _REDOPS)})", field="op")
    if t.dtype == torch.bool:
        return {"sum": "max", "prod": "min"}.get(name, name)
    return name


def _reduction(op: Any) -> tuple[Any, Any]:
    """What gloo runs for a reduce op, and what is done to the result afterwards: gloo has no AVG (run SUM,
    then divide) and no PREMUL_SUM, NCCL's scaled sum that FSDP2 uses (run SUM, then scale: the same sum)."""
    if op == ReduceOp.AVG:
        return ReduceOp.SUM, "avg"
    if op == ReduceOp.PREMUL_SUM:
        factor = op.__getstate__()[1]
        return ReduceOp.SUM, factor
    return op, None


def _finisher(tensors: Sequence[torch.Tensor], n: int, how: Any) -> Callable[[], None] | None:
    """The step after gloo's reduction (`_reduction`), or None."""
    if how is None:
        return None

    def run() -> None:
        for t in tensors:
            if not isinstance(how, str):
                t.mul_(how)
            elif t.is_floating_point() or t.is_complex():
                t.div_(n)
            else:
                t.floor_divide_(n)

    return run


def _unequal(parts: Sequence[torch.Tensor], n: int) -> bool:
    """A list collective's parts, one a member, of unequal shapes (ProcessGroupNCCL's `check_same_size` fails)."""
    return len(parts) == n and len({tuple(t.shape) for t in parts}) > 1


def _host_data(t: torch.Tensor) -> torch.Tensor:
    """The host tensor holding a simulated-GPU tensor's values in real mode (the tensor itself on the host)."""
    return t.elem if isinstance(t, SimCudaTensor) else t


def _copier(out: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
    """Copy `src` into `out` (an out-of-place collective's own part, run where gloo's work is not GPU work)."""

    def run() -> None:
        out.copy_(src)

    return run


def _chain(first: Callable[[], None] | None, then: Callable[[], None] | None) -> Callable[[], None] | None:
    """`first`, then `then` (either may be None)."""
    if first is None or then is None:
        return first or then

    def run() -> None:
        first()
        then()

    return run


def _nothing() -> list[Any]:
    """The inner half of a collective in phantom mode: no data moves."""
    return []


# ProcessGroupNCCL's names of the operations (c10d's opTypeToString), as its timeout message gives them
_OP_TYPES = {
    "all_reduce": "ALLREDUCE",
    "all_gather": "ALLGATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_to_all": "ALLTOALL",
    "send": "SEND",
    "recv": "RECV",
}


def _timed_out(group: PhantoraProcessGroup | None, p: Pending, timeout: datetime.timedelta, ran_s: float) -> str:
    """What ProcessGroupNCCL's `WorkNCCL::wait(timeout)` raises past its timeout (its `checkTimeout` text: the rank
    in the group, the operation, the wall time since the call; not its sequence number, element counts or the group's
    timeout), and phantora's account of the call it stood for."""
    rank = group.rank() if group is not None else _session.require().rank
    return (
        f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(OpType="
        f"{_OP_TYPES.get(p.kind, p.kind.upper())}) ran for {int(ran_s * 1000)} milliseconds before timing out. "
        f"(phantora: global rank {_session.require().rank}'s Work.wait(timeout={timeout.total_seconds():g} s) on "
        f"{p.kind} {p.name!r} ({p.nbytes} B, ranks {list(p.group)}) passed its timeout, the host's wall time, "
        "before the coordinator answered: the call's peers had not all issued it, or the network had not finished "
        "it; as ProcessGroupNCCL's wait does, its communicator is aborted)"
    )


def aborted_error(group_rank: int, reason: str) -> dist.DistBackendError:
    """What a call on a communicator aborted past a wait's timeout raises: NCCLComm's `getNcclComm()` text, with the
    reason it gives when it knows one."""
    return dist.DistBackendError(
        f"NCCL communicator was aborted on rank {group_rank}.  Original reason for failure was: {reason}"
    )


class PhantoraWork(dist.Work):
    """An in-flight collective. `wait()` makes the caller's current CUDA stream wait for it, as ProcessGroupNCCL's
    does: on the default stream the compute lane joins its completion; on a side stream (a sync collective's own,
    which torch's c10d waits on at once) only that stream's later collectives follow it (stream_deps), and a
    kernel that reads its data joins it then. A barrier's wait, and `synchronize()`, block the host: a join."""

    def __init__(
        self,
        session: RankSession,
        pending: Sequence[Pending],
        result: list[torch.Tensor],
        host: bool = False,
        group: PhantoraProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self._session = session
        self._pending = list(pending)
        self._result = result
        self._host = host
        self._group = group
        self._t0 = time.monotonic()  # the call, in wall time: ProcessGroupNCCL times a wait's timeout from it
        self._error = ""  # set once a wait passed its timeout: what every later wait raises
        self.unsent = False  # a device block's collective not sent yet (coalesce_block.py): its wait is a no-op

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """With a timeout (torch's default, timedelta(0), is none), the host blocks until the work is done, as
        ProcessGroupNCCL's does; if the coordinator has not answered within it (the host's wall time, as torch
        measures it), the work fails as ProcessGroupNCCL's does: `DistBackendError` (its watchdog's timeout text), its
        communicator aborted (`RankSession.abort`), so a later call on it raises, and so does every later wait."""
        if self._error:
            raise dist.DistBackendError(self._error)
        if timeout is not None and timeout > datetime.timedelta(0):
            deadline = time.monotonic() + timeout.total_seconds()
            for p in self._pending:
                try:
                    self._session.join(p, deadline)
                except WaitTimedOut:
                    self._fail(p, timeout)
            self._session.host_waits()
            return True
        if self._host:
            self.synchronize()
        else:
            self._session.stream_wait(sim_streams.current_stream().stream_id, self._pending)
        return True

    def _fail(self, late: Pending, timeout: datetime.timedelta) -> None:
        """`late`'s wait passed `timeout`: fail the work, abort the communicators of its calls not done, raise."""
        self._error = _timed_out(self._group, late, timeout, time.monotonic() - self._t0)
        for p in self._pending:
            if p.t_done is None:
                self._session.abort(p, self._error)
        raise dist.DistBackendError(self._error) from None

    def synchronize(self) -> None:
        for p in self._pending:
            self._session.join(p)
        self._session.host_waits()

    def block_current_stream(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        if self.unsent:
            return False
        return bool(self._error) or all(self._session.poll(p) for p in self._pending)

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def _source_rank(self) -> int:
        """A recv from any source: the group rank it received from (torch's `dist.recv` returns its global rank);
        -1 until the coordinator has said, as gloo's RecvWork answers before its wait."""
        src = self._session.any_recvs.source(self._pending[0]) if len(self._pending) == 1 else None
        if src is None or self._group is None:
            return -1
        return self._group.global_ranks.index(src)

    def get_future(self) -> Future:
        """A completed future holding the outputs; reading them joins the collective (data dependency)."""
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


class PhantoraProcessGroup(dist.ProcessGroup):
    """A simulated process group over the global ranks `ranks`, carrying real data over gloo."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        ranks: Sequence[int],
        session: RankSession,
    ) -> None:
        super().__init__(rank, size)
        self._s = session
        self._ranks = tuple(int(r) for r in ranks)
        # its number among the rank's groups (RankSession.comm_of): which of those over its ranks it is (`_pg`)
        self._comm = session.new_comm(self._ranks)
        self._pg = session.comm_of(self._comm)
        self._peer_pg: dict[int, int] = {}  # global peer -> which of the groups holding this rank and the peer it is
        self._store = store
        self._timeout = timeout
        self._splits = 0  # the splits this rank is a member of (torch names a split's description by it)
        self._split_calls = 0  # every split of this group, member or not: the same count on all its ranks
        self.torch_backend = ""  # what torch on a CUDA build answers for this group (backend_name.py); "" = default's
        self._name = ""
        self._desc = ""
        self._coalescing: list[Pending] | None = None
        self._held: list[HeldCall] | None = None  # an open device block's collectives, sent at its end
        self._p2p_open = False  # a p2p group (batch_isend_irecv, coalescing) is open on this group's communicator
        self._stream = next(_STREAM_IDS)  # its NCCL stream: its collectives run one after another (stream_order)
        self._pair_streams: dict[int, int] = {}  # peer -> the stream of a lone send/recv's 2-rank communicator
        self._launch: int | None = None  # the open coalescing block's NCCL group launch: its calls start together
        self._sync = False  # the call being issued is async_op=False: it runs on the caller's current CUDA stream
        self._nccl_env = program_nccl_env(session.nccl_env_at_start)  # NCCL_* the program set before creating it
        self._mirrors_checked = False  # mirror_groups.check done at its first collective
        self._gloo: UnownedGloo | None = None
        # a plain gloo group of real mode (`new_group(backend="gloo")`): its calls are host-side synchronisations of
        # zero network bytes, each member leaving at the latest member's issue (`_map_backend`)
        self._gloo_sync = False
        self.plain_gloo = False  # asked for as plain gloo (either mode): it may receive from any source
        self._home = threading.get_ident()  # the rank's thread: a gloo call from another runs on gloo alone
        # real mode's sends and receives, off the rank's thread until their pair is connected (gloo_lanes.py)
        self._pairs = PairLanes(timeout.total_seconds(), self._ranks)
        if not session.phantom:
            opts = ProcessGroupGloo._Options()
            opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            opts._timeout = timeout
            self._gloo = UnownedGloo(ProcessGroupGloo(PrefixStore("phantora-gloo/", store), rank, size, opts))

    @property
    def _data(self) -> UnownedGloo:
        """The gloo group that moves the real data (real mode; phantom mode never starts a transfer)."""
        assert self._gloo is not None, "phantom mode moves no data"
        return self._gloo

    # ----- identity -----------------------------------------------------------------------------
    phantora_group = True  # how phantora tells its groups from others (object_values): the names say "nccl"

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name
        """The name `_get_backend_name()` gives a CUDA request's group, "nccl" (its default backend type is NCCL for
        "nccl", "cpu:gloo,cuda:nccl" and a bare request on a CUDA host), "gloo" for a plain gloo group's; torch's own
        map still says phantora."""
        return GLOO_NAME if self.gloo_sync else CUDA_NAME

    @property
    def gloo_sync(self) -> bool:
        """A plain gloo group of real mode (`_map_backend`)."""
        return self._gloo_sync

    @gloo_sync.setter
    def gloo_sync(self, on: bool) -> None:
        """Become (or not) a plain gloo group. As one, its inner gloo group is also its GLOO backend: DDP's logger
        reads a group named "gloo" through it (`getBackend(GLOO)`, its thread count), which stopped DDP on cuda
        tensors over `init_process_group("gloo")` (torch's DDP tutorial) with "Could not find backend type 1"."""
        self._gloo_sync = bool(on)
        if on and self._gloo is not None and not self._gloo_registered:
            self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo.inner)
            self._gloo_registered = True

    _gloo_registered = False

    def _get_backend(self, device: Any) -> PhantoraProcessGroup:
        """The backend for `device`: this group serves every device. torch asks when a program binds its
        GPU with `init_process_group(device_id=...)`, as DeepSpeed does."""
        return self

    supports_splitting = True  # as ProcessGroupNCCL: torch splits it (split_group, DeviceMesh) under eager init
    options = None  # torch deep-copies the parent's options into a split; a phantora group takes none

    def split_group(
        self,
        ranks: Sequence[int],
        timeout: datetime.timedelta | None = None,
        opts: Any = None,
        group_name: str = "",
        group_desc: str = "",
        device_types: Any = None,
    ) -> PhantoraProcessGroup | None:
        """ncclCommSplit as torch's `split_group` asks it: a new phantora group of this group's ranks `ranks`
        (group ranks), the same collectives over their global ranks; None on a rank outside `ranks`.

        Every rank of this group calls it, in the same order (a split is collective over the parent), so the
        real-data gloo group meets under that call's number and its members' global ranks. Not under
        `group_name`: torch hashes it from the number of groups the calling rank holds, which differs between
        ranks that were and were not members of an earlier new_group (the split then hung)."""
        self._split_calls += 1
        members = sorted(int(r) for r in ranks)
        if self.rank() not in members:
            return None
        self._splits += 1
        global_ranks = [self._ranks[r] for r in members]
        meet = f"{self._split_calls}/{'.'.join(map(str, global_ranks))}"
        store = PrefixStore(f"phantora-split/{meet}/", self._store)
        g = PhantoraProcessGroup(
            store, members.index(self.rank()), len(members), timeout or self._timeout, global_ranks, self._s
        )
        g.torch_backend = self.torch_backend
        g.gloo_sync = self.gloo_sync
        g.plain_gloo = self.plain_gloo
        g._set_group_name(dist.distributed_c10d.GroupName(group_name))
        g._set_group_desc(group_desc or f"{self.group_desc}:split:{self._splits}")
        return g

    def comm_split_count(self) -> int:
        """How many groups were split from this one (torch names a split's description by it)."""
        return self._splits

    def get_group_store(self) -> dist.Store:
        return self._store

    def eager_connect_single_device(self, device: Any) -> None:
        """NCCL makes the communicator at init under eager init; a phantora group is ready when made."""

    def perform_nocolor_split(self, device: Any) -> None:
        """A rank outside a new group takes part in NCCL's split with no colour; phantora has nothing to do."""

    def _set_sequence_number_for_group(self) -> None:
        """torch numbers a split group's collectives through its backend; phantora tracks its own."""

    def name(self) -> str:
        """ProcessGroupNCCL's name, as `group._get_backend(cuda).name()` answers (DeviceMesh compares it); a plain
        gloo group's is ProcessGroupGloo's."""
        return GLOO_NAME if self.gloo_sync else CUDA_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._ranks

    def __repr__(self) -> str:
        return f"PhantoraProcessGroup(ranks={list(self._ranks)}, rank={self.rank()})"

    # ----- plumbing -----------------------------------------------------------------------------
    def _work(self, p: Pending, result: list[torch.Tensor]) -> PhantoraWork:
        if self._coalescing is not None:
            self._coalescing.append(p)
        return PhantoraWork(self._s, [p], result, host=self.gloo_sync, group=self)

    def _alive(self, stream: int | None) -> None:
        """Refuse a call on a communicator (NCCL stream) that a wait past its timeout aborted (`PhantoraWork.wait`),
        as ProcessGroupNCCL refuses it: DistBackendError, naming why."""
        reason = self._s.aborted.get(stream) if stream is not None and self._s.aborted else None
        if reason is not None:
            raise aborted_error(self.rank(), reason)

    def _coll(
        self,
        kind: str,
        size: int,
        dtype_of: torch.Tensor,
        tensors: list[torch.Tensor],
        start: Callable[[], list[Any]],
        result: list[torch.Tensor],
        *,
        root: int | None = None,
        finalize: Callable[[], None] | None = None,
        name: str | None = None,
        transfers: Sequence[Transfer] | None = None,
        values: Callable[[], Callable[[], None] | None] | None = None,
        redop: str = "sum",
        group_sizes: Sequence[int] = (),
        group_dtypes: Sequence[str] = (),
    ) -> PhantoraWork:
        self._alive(self._stream)
        if self.gloo_sync and off_thread(self._home):  # not the rank's thread: gloo alone (gloo_thread.py)
            return GlooOnlyWork(start(), result, finalize)  # type: ignore[return-value]
        if self.gloo_sync:  # a plain gloo group: a synchronisation, no network bytes (`_map_backend`)
            p = self._s.issue(**_sync_call(self, kind, tensors, start, finalize, name))
            p.host_ns = gloo_cost.host_ns(kind, size)  # 0 unless PHANTORA_GLOO_COST opts in
            return self._work(p, result)
        if self._gloo is None:  # phantom mode: timing only, and the values of small integer tensors (tensor_values)
            start = _nothing
            finalize = values() if values is not None else None  # the values are posted here, before the issue
        cuda_stream = sim_streams.current_stream().stream_id
        if self._held is not None and transfers is None and kind in GROUPED:  # a device block: sent at its end
            sizes = tuple(group_sizes) or (size,)
            types = tuple(group_dtypes) or (dtype_name(dtype_of),) * len(sizes)
            held = HeldCall(
                kind, name or kind, redop, root, sizes, types, dtype_of, tensors, start, finalize, result,
                self._sync, cuda_stream, PhantoraWork(self._s, [], result, group=self),
            )  # fmt: skip
            held.work.unsent = True
            self._held.append(held)
            return held.work  # type: ignore[no-any-return]
        grouped = transfers is not None and not self._p2p_open  # one NCCL group on this communicator (p2p_group.py)
        if grouped:
            self._p2p_group(self._ranks)
        p = self._issue(
            kind, name or kind, size, dtype_of, tensors, start, finalize, root, redop, group_sizes, group_dtypes,
            self._sync, cuda_stream, transfers,
        )  # fmt: skip
        if grouped:
            self._p2p_group(None)
        return self._work(p, result)

    def _issue(
        self,
        kind: str,
        name: str,
        size: int,
        dtype_of: torch.Tensor,
        tensors: list[torch.Tensor],
        start: Callable[[], list[Any]],
        finalize: Callable[[], None] | None,
        root: int | None,
        redop: str,
        group_sizes: Sequence[int],
        group_dtypes: Sequence[str],
        sync: bool,
        cuda_stream: int,
        transfers: Sequence[Transfer] | None = None,
        group_kinds: Sequence[str] = (),
        group_redops: Sequence[str] = (),
        group_roots: Sequence[int | None] = (),
    ) -> Pending:
        """Tell the session of one collective of this group, on its NCCL stream and in the open launch; a device
        block's calls of several kinds, reductions or roots (group ranks) as one (`group_kinds`, ...)."""
        if not self._mirrors_checked:  # rank deduplication: the group's shifted copies are groups the program made
            self._mirrors_checked = True
            live = getattr(self._s.client, "live", None)
            if isinstance(live, int):
                mirror_groups.check(self._ranks, self._s.world_size, live, kind)
        return self._s.issue(
            kind=kind,
            name=name,
            group=self._ranks,
            nbytes=size,
            dtype=dtype_name(dtype_of),
            root=None if root is None else self._ranks[root],
            tensors=tensors,
            start_inner=start,
            transfers=transfers,
            finalize=finalize,
            stream=self._stream,
            launch=self._launch,
            cuda_stream=cuda_stream,
            sync=sync,
            nccl_env=self._nccl_env,
            redop=redop,
            pg=self._pg,
            group_sizes=group_sizes,
            group_dtypes=group_dtypes,
            group_kinds=group_kinds,
            group_redops=group_redops,
            group_roots=tuple(None if r is None else self._ranks[r] for r in group_roots),
        )

    def _me(self) -> int:
        return self.rank()

    def _values(self, tensors: list[torch.Tensor], plan: Callable[[], Any]) -> Callable[[], Any] | None:
        """`plan` (tensor_values' plan of this collective: it posts the values, then gives their finish) if its
        tensors' values travel, else None. `_coll` runs it before it issues the collective."""
        return plan if self._gloo is None and tensor_values.carried(tensors) else None

    def _p2p_start(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Callable[[], list[Any]]:
        """The inner half of a send; in phantom mode its values (if carried) are posted now, before the issue."""
        if self._gloo is not None:
            return lambda: [self._pairs.start(dst, lambda: self._data.send(tensors, dst, tag))]
        if tensor_values.carried(tensors):
            tensor_values.send(
                self._ranks[self.rank()], self._ranks[dst], tensors, tag, self._pair_pg(self._ranks[dst])
            )
        return _nothing

    def _p2p_finish(self, tensors: list[torch.Tensor], src: int, tag: int) -> Callable[[], None] | None:
        if self._gloo is None and tensor_values.carried(tensors):
            me, peer = self._ranks[self.rank()], self._ranks[src]
            return tensor_values.recv(peer, me, tensors, tag, self._pair_pg(peer))
        return None

    # ----- all-reduce, broadcast, reduce ---------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None) -> PhantoraWork:
        tensors = _flat(tensors)
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            o = AllreduceOptions()
            o.reduceOp = op
            return [self._data.allreduce(tensors, o)]

        fin = _finisher(tensors, self.size(), how)
        values = self._values(
            tensors, lambda: tensor_values.all_reduce(self._ranks, tensors, _reduce_op(opts), self._pg)
        )
        size, op_name = nbytes(tensors), redop_name(_reduce_op(opts), tensors[0])
        return self._coll(
            "all_reduce", size, tensors[0], tensors, start, tensors, finalize=fin, values=values, redop=op_name
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> PhantoraWork:
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            works = []
            for t in tensors:
                o = AllreduceOptions()
                o.reduceOp = op
                works.append(self._data.allreduce([t], o))
            return works

        fin = _finisher(tensors, self.size(), how)
        op_name = redop_name(_reduce_op(opts), tensors[0])
        sizes, types = _call_sizes([[t] for t in tensors]), _call_dtypes([[t] for t in tensors])
        return self._coll(
            "all_reduce", nbytes(tensors), tensors[0], tensors, start, tensors, finalize=fin, redop=op_name,
            group_sizes=sizes, group_dtypes=types,
        )  # fmt: skip

    def broadcast(self, tensors: Any, opts: Any = None) -> PhantoraWork:
        tensors = _flat(tensors)
        root = opts.rootRank if isinstance(opts, BroadcastOptions) else int(opts or 0)

        def start() -> list[Any]:
            o = BroadcastOptions()
            o.rootRank = root
            return [self._data.broadcast(tensors, o)]

        values = self._values(
            tensors, lambda: tensor_values.broadcast(self._ranks, self.rank(), root, tensors, self._pg)
        )
        return self._coll("broadcast", nbytes(tensors), tensors[0], tensors, start, tensors, root=root, values=values)

    def reduce(self, tensors: Any, opts: Any = None) -> PhantoraWork:
        tensors = _flat(tensors)
        root = opts.rootRank if opts is not None else 0
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            o = ReduceOptions()
            o.rootRank = root
            o.reduceOp = op
            return [self._data.reduce(tensors, o)]

        fin = _finisher(tensors, self.size(), how) if self.rank() == root else None
        op_name = redop_name(_reduce_op(opts), tensors[0])
        return self._coll(
            "reduce", nbytes(tensors), tensors[0], tensors, start, tensors, root=root, finalize=fin, redop=op_name
        )

    # ----- all-gather -----------------------------------------------------------------------------
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: Any, opts: Any = None) -> PhantoraWork:
        inputs = _flat(inputs)
        outs = _flat(output_lists)
        if _unequal(outs, self.size()) and len(inputs) == 1 and not self.gloo_sync:
            return self._allgather_v(outs, inputs[0])

        def start() -> list[Any]:
            return [self._data.allgather(output_lists, inputs, AllgatherOptions())]

        values = self._values(outs + inputs, lambda: tensor_values.all_gather(self._ranks, inputs, outs, self._pg))
        return self._coll("all_gather", nbytes(outs), inputs[0], outs + inputs, start, outs, values=values)

    def _allgather_v(self, outs: list[torch.Tensor], input: torch.Tensor) -> PhantoraWork:
        """An all-gather into outputs of unequal shapes, as ProcessGroupNCCL runs it (its `allgather` when
        `check_same_size` fails: Megatron's all-gather of unequal token counts): one NCCL group of broadcasts,
        member i's input from root i into every member's `outs[i]`. Gloo, which moves real mode's data, refuses
        unequal sizes, so each broadcast moves its part on its own."""
        me = self.rank()
        return self._group_of(
            lambda: [self._broadcast_oop(out, input if i == me else out, i) for i, out in enumerate(outs)], outs
        )

    def _broadcast_oop(self, out: torch.Tensor, input: torch.Tensor, root: int) -> PhantoraWork:
        """ProcessGroupNCCL's out-of-place broadcast: the root's `input` into every member's `out`."""
        me = self.rank()
        src = input if me == root else out

        def start() -> list[Any]:
            o = BroadcastOptions()
            o.rootRank = root
            return [self._data.broadcast([src], o)]

        own = _copier(out, input) if me == root and out is not input else None
        values = self._values(
            [src], lambda: _chain(tensor_values.broadcast(self._ranks, me, root, [src], self._pg), own)
        )
        size = nbytes([out])
        return self._coll("broadcast", size, out, [out, input], start, [out], root=root, finalize=own, values=values)

    def _group_of(self, issue: Callable[[], list[PhantoraWork]], result: list[torch.Tensor]) -> PhantoraWork:
        """The calls `issue` makes, in one NCCL group (ProcessGroupNCCL's startCoalescing ... endCoalescing), or in
        the device block already open; a work that waits for them all."""
        if self._held is not None:  # inside a `_coalescing_manager` block: its group holds them, and all their
            work = issue()[-1]  # works wait for the one call the block sends at its end
            work._result = result
            return work
        self._start_coalescing()
        issue()
        work = self._end_coalescing()
        work._result = result
        return work

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> PhantoraWork:
        def start() -> list[Any]:  # NCCL asks only that the sizes agree (accelerate gathers (1, n) into (2n,))
            return [self._data._allgather_base(output.view(-1), input.reshape(-1), AllgatherOptions())]

        values = self._values(
            [output, input], lambda: tensor_values.all_gather(self._ranks, [input], [output], self._pg)
        )
        return self._coll("all_gather", nbytes([output]), input, [output, input], start, [output], values=values)

    _allgather_base = all_gather_single

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> PhantoraWork:
        outs = _flat(output_lists)

        def start() -> list[Any]:
            return [
                self._data.allgather([ol], [i], AllgatherOptions()) for ol, i in zip(output_lists, inputs, strict=True)
            ]

        sizes, types = _call_sizes(output_lists), _call_dtypes([[i] for i in inputs])
        tensors = outs + list(inputs)
        return self._coll(
            "all_gather", nbytes(outs), inputs[0], tensors, start, outs, group_sizes=sizes, group_dtypes=types
        )

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> PhantoraWork:
        def start() -> list[Any]:
            return [self._data._allgather_base(o, i, AllgatherOptions()) for o, i in zip(outputs, inputs, strict=True)]

        tensors, sizes = list(outputs) + list(inputs), _call_sizes([[o] for o in outputs])
        types = _call_dtypes([[i] for i in inputs])
        return self._coll(
            "all_gather", nbytes(outputs), inputs[0], tensors, start, list(outputs), group_sizes=sizes,
            group_dtypes=types,
        )  # fmt: skip

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ----- reduce-scatter -------------------------------------------------------------------------
    def reduce_scatter(self, outputs: Any, input_lists: list[list[torch.Tensor]], opts: Any = None) -> PhantoraWork:
        outputs = _flat(outputs)
        ins = _flat(input_lists)
        if _unequal(ins, self.size()) and len(outputs) == 1 and not self.gloo_sync:
            return self._reduce_scatter_v(outputs[0], ins, _reduce_op(opts))
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            o = ReduceScatterOptions()
            o.reduceOp = op
            return [self._data.reduce_scatter(outputs, input_lists, o)]

        fin = _finisher(outputs, self.size(), how)
        op_name = redop_name(_reduce_op(opts), outputs[0])
        return self._coll(
            "reduce_scatter", nbytes(ins), outputs[0], outputs + ins, start, outputs, finalize=fin, redop=op_name
        )

    def _reduce_scatter_v(self, output: torch.Tensor, ins: list[torch.Tensor], reduce_op: Any) -> PhantoraWork:
        """A reduce-scatter of inputs of unequal shapes, as ProcessGroupNCCL runs it (its `reduce_scatter` when
        `check_same_size` fails): one NCCL group of reductions, every member's `ins[i]` reduced into root i's
        `output` (the backward of `_allgather_v`)."""
        me = self.rank()
        return self._group_of(
            lambda: [self._reduce_oop(output if i == me else x, x, i, reduce_op) for i, x in enumerate(ins)], [output]
        )

    def _reduce_oop(self, out: torch.Tensor, input: torch.Tensor, root: int, reduce_op: Any) -> PhantoraWork:
        """ProcessGroupNCCL's out-of-place reduce: every member's `input` reduced into the root's `out`; no
        member's `input` changes (gloo reduces in place: it reduces a copy)."""
        op, how = _reduction(reduce_op)
        buf: list[torch.Tensor] = []

        def start() -> list[Any]:
            buf.append(_host_data(input).detach().clone())
            o = ReduceOptions()
            o.rootRank = root
            o.reduceOp = op
            return [self._data.reduce(buf, o)]

        fin = None
        if self.rank() == root:
            scale = _finisher([out], self.size(), how)

            def fin() -> None:
                _host_data(out).copy_(buf[0])
                if scale is not None:
                    scale()

        op_name = redop_name(reduce_op, input)
        return self._coll(
            "reduce", nbytes([input]), input, [out, input], start, [out], root=root, finalize=fin, redop=op_name
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> PhantoraWork:
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            o = ReduceScatterOptions()
            o.reduceOp = op
            return [self._data._reduce_scatter_base(output.view(-1), input.reshape(-1), o)]  # as all_gather_single

        fin = _finisher([output], self.size(), how)
        op_name = redop_name(_reduce_op(opts), input)
        return self._coll(
            "reduce_scatter", nbytes([input]), input, [output, input], start, [output], finalize=fin, redop=op_name
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> PhantoraWork:
        op, how = _reduction(_reduce_op(opts))

        def start() -> list[Any]:
            works = []
            for o_t, i_t in zip(outputs, inputs, strict=True):
                o = ReduceScatterOptions()
                o.reduceOp = op
                works.append(self._data._reduce_scatter_base(o_t, i_t, o))
            return works

        fin = _finisher(outputs, self.size(), how)
        tensors = list(outputs) + list(inputs)
        op_name = redop_name(_reduce_op(opts), inputs[0])
        sizes, types = _call_sizes([[i] for i in inputs]), _call_dtypes([[i] for i in inputs])
        return self._coll(
            "reduce_scatter", nbytes(inputs), inputs[0], tensors, start, list(outputs), finalize=fin, redop=op_name,
            group_sizes=sizes, group_dtypes=types,
        )  # fmt: skip

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----- all-to-all, gather, scatter (sent as transfers where sizes differ) --------------------------
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> PhantoraWork:
        outs, ins = list(output_split_sizes), list(input_split_sizes)

        def start() -> list[Any]:
            return [self._data.alltoall_base(output, input, outs, ins, AllToAllOptions())]

        n = self.size()
        in_rows = ins or [input.shape[0] // n] * n
        out_rows = outs or [output.shape[0] // n] * n
        values = self._all_to_all_values([output, input], lambda: tensor_values.split_rows(input, in_rows), [output])
        transfers = None  # no splits given: an ordinary all-to-all collective
        if outs or ins:  # splits: one NCCL group of transfers on every rank, even or not (_pairwise)
            row_in = input[0].numel() * input.element_size() if input.dim() and input.shape[0] else 0
            row_out = output[0].numel() * output.element_size() if output.dim() and output.shape[0] else 0
            transfers = self._all_to_all_transfers([row_in * k for k in in_rows], [row_out * k for k in out_rows])
        return self._coll(
            "all_to_all", nbytes([input]), input, [output, input], start, [output], transfers=transfers, values=values
        )

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> PhantoraWork:
        def start() -> list[Any]:
            return [self._data.alltoall(outputs, inputs, AllToAllOptions())]

        transfers = self._all_to_all_transfers([nbytes([t]) for t in inputs], [nbytes([t]) for t in outputs])
        tensors = list(outputs) + list(inputs)
        values = self._all_to_all_values(tensors, lambda: list(inputs), list(outputs))
        return self._coll(
            "all_to_all", nbytes(inputs), inputs[0], tensors, start, list(outputs), transfers=transfers, values=values
        )

    def _all_to_all_values(
        self, tensors: list[torch.Tensor], parts: Callable[[], list[torch.Tensor]], outputs: list[torch.Tensor]
    ) -> Callable[[], Any] | None:
        """The value plan of an all-to-all, decided by dtype alone: its members' parts may differ in size (uneven
        splits), so each member decides as every other does, and a member over the limit posts none. `parts` (this
        member's part for each, in rank order) is cut only when the plan runs."""
        if self._gloo is not None or not tensor_values.integral(tensors):
            return None
        return lambda: tensor_values.all_to_all(self._ranks, self.rank(), parts(), outputs, self._pg)

    def _all_to_all_transfers(self, send: Sequence[int], recv: Sequence[int]) -> list[Transfer] | None:
        """An all-to-all given its parts (`send`, `recv`: bytes a group rank) as NCCL runs it: one group of transfers,
        on every member whatever its parts, since each sees only its own (members deciding by them could post a
        collective here and transfers there, and never meet). An even group is rated as the all-to-all is
        (nccl/p2p_group.py). Where rank deduplication mirrors two of the group's ranks onto one live rank, no
        transfer between them can run: the all-to-all collective if even, else a one-line error."""
        live = getattr(self._s.client, "live", None)
        if not isinstance(live, int) or len({r % live for r in self._ranks}) == len(self._ranks):
            return self._pairwise(send, recv, self.rank())
        if len(set(send)) == 1 and set(recv) == set(send):
            return None
        raise InputError(
            f"an all-to-all with uneven parts on ranks {list(self._ranks)}, two of which one live rank stands for "
            f"(rank deduplication, {live} live ranks): run with --dedup off",
            field="--dedup",
        )

    def _pairwise(self, send_bytes: Sequence[int], recv_bytes: Sequence[int], me: int) -> list[Transfer]:
        out = []
        for j, peer in enumerate(self._ranks):
            if j != me:
                out.append(Transfer(peer, True, int(send_bytes[j])))
                out.append(Transfer(peer, False, int(recv_bytes[j])))
        return out

    def gather(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> PhantoraWork:
        root = opts.rootRank if opts is not None else 0
        outs = _flat(output_lists)

        def start() -> list[Any]:
            o = GatherOptions()
            o.rootRank = root
            return [self._data.gather(output_lists, inputs, o)]

        me = self.rank()
        if me == root:
            sizes = [nbytes([t]) for t in output_lists[0]]
            transfers = [Transfer(self._ranks[j], False, sizes[j]) for j in range(self.size()) if j != me]
        else:
            transfers = [Transfer(self._ranks[root], True, nbytes(inputs))]
        tensors = outs + list(inputs)
        size = nbytes(inputs) * self.size()
        return self._coll("gather", size, inputs[0], tensors, start, outs, transfers=transfers)

    def scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> PhantoraWork:
        root = opts.rootRank if opts is not None else 0
        ins = _flat(input_lists)

        def start() -> list[Any]:
            o = ScatterOptions()
            o.rootRank = root
            return [self._data.scatter(outputs, input_lists, o)]

        me = self.rank()
        if me == root:
            sizes = [nbytes([t]) for t in input_lists[0]]
            transfers = [Transfer(self._ranks[j], True, sizes[j]) for j in range(self.size()) if j != me]
        else:
            transfers = [Transfer(self._ranks[root], False, nbytes(outputs))]
        tensors = list(outputs) + ins
        size = nbytes(outputs) * self.size()
        return self._coll("scatter", size, outputs[0], tensors, start, list(outputs), transfers=transfers)

    # ----- point to point, barrier, coalescing --------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> PhantoraWork:
        if self.gloo_sync:
            start = self._p2p_start(tensors, dst, tag)
            if off_thread(self._home):
                return GlooOnlyWork(start(), tensors, None)  # type: ignore[return-value]
            return self._work(self._s.issue_p2p(**_sync_p2p(self, dst, True, tag, tensors, start)), tensors)
        self._alive(self._stream if self._p2p_open or EAGER_INIT[0] else self._pair_streams.get(dst))
        lone = self._lone_on_group()
        stream, launch = self._p2p_stream(dst)
        eager = lone or not self._p2p_open  # handed off if its connection's slots take it: issue_p2p
        copy = eager and self._gloo is not None  # real data: copied if it hands off before its receive is issued
        p = self._s.issue_p2p(
            peer=self._ranks[dst],
            is_send=True,
            tag=tag,
            nbytes=nbytes(tensors),
            tensors=tensors,
            start_inner=self._p2p_start(tensors, dst, tag),
            start_copied=(lambda copies: self._p2p_start(copies, dst, tag)()) if copy else None,
            nccl_env=self._nccl_env,
            stream=stream,
            launch=launch,
            cuda_stream=sim_streams.current_stream().stream_id,
            eager=eager,
            comm_ranks=self._ranks if lone else None,  # eager init: the group's communicator, not the pair's own
            pg=self._pair_pg(self._ranks[dst]),
        )
        if lone:
            self._p2p_group(None)
        return self._work(p, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> PhantoraWork:
        if self.gloo_sync:
            start = lambda: [self._pairs.start(src, lambda: self._data.recv(tensors, src, tag))]  # noqa: E731
            if off_thread(self._home):
                return GlooOnlyWork(start(), tensors, None)  # type: ignore[return-value]
            return self._work(self._s.issue_p2p(**_sync_p2p(self, src, False, tag, tensors, start)), tensors)
        self._alive(self._stream if self._p2p_open or EAGER_INIT[0] else self._pair_streams.get(src))
        lone = self._lone_on_group()
        stream, launch = self._p2p_stream(src)
        p = self._s.issue_p2p(
            peer=self._ranks[src],
            is_send=False,
            tag=tag,
            nbytes=nbytes(tensors),
            tensors=tensors,
            start_inner=(lambda: [self._pairs.start(src, lambda: self._data.recv(tensors, src, tag))])
            if self._gloo is not None
            else _nothing,
            finalize=self._p2p_finish(tensors, src, tag),
            nccl_env=self._nccl_env,
            stream=stream,
            launch=launch,
            cuda_stream=sim_streams.current_stream().stream_id,
            pg=self._pair_pg(self._ranks[src]),
        )
        if lone:
            self._p2p_group(None)
        return self._work(p, tensors)

    def values_pg(self, peer: int | None = None) -> int:
        """Which of the rank's groups over these ranks this is (with a global `peer`: of those holding the rank and
        `peer`): the key space of its carried values (tensor_values, object_values)."""
        return self._pg if peer is None else self._pair_pg(peer)

    def _pair_pg(self, peer: int) -> int:
        """Which of this rank's groups holding it and global rank `peer` this one is (RankSession.comm_of): its sends
        and receives with `peer` are numbered apart from other groups' (each its own NCCL communicator)."""
        pg = self._peer_pg.get(peer)
        if pg is None:
            pg = self._peer_pg[peer] = self._s.comm_of(self._comm, peer)
        return pg

    def _p2p_stream(self, peer: int) -> tuple[int, int | None]:
        """The NCCL stream and group launch of a send/recv with group rank `peer`, as ProcessGroupNCCL's
        pointToPoint picks them: in a p2p group (batch_isend_irecv, a coalescing block, a lone op under eager init)
        the group's communicator and stream, with the block's launch; otherwise the stream of the peer pair's own
        2-rank communicator, on which this group's sends and receives between the two run in turn."""
        if self._p2p_open:
            return self._stream, self._launch
        stream = self._pair_streams.get(peer)
        if stream is None:
            stream = self._pair_streams[peer] = next(_STREAM_IDS)
        return stream, None

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> PhantoraWork:
        """gloo's recvAnysource, on a plain gloo group: the coordinator gives it the matching send issued earliest in
        virtual time (bridge/anysource.py), and in real mode gloo then receives from that rank (runtime/any_source.py).
        ProcessGroupNCCL has none: on any other group it is refused."""
        if not self.plain_gloo:
            raise PhantoraError(
                "recv from any source on an NCCL group: ProcessGroupNCCL has no recvAnysource (a gloo group has); "
                "name the source rank"
            )
        if self.gloo_sync and off_thread(self._home):  # not the rank's thread: gloo alone (gloo_thread.py)
            return GlooOnlyWork([self._data.recv_anysource(tensors, tag)], tensors, None)  # type: ignore[return-value]
        me = self.rank()
        peers = [(g, self._pair_pg(g)) for j, g in enumerate(self._ranks) if j != me]

        def on_source(src: int) -> tuple[list[Any], Callable[[], None] | None]:
            j = self._ranks.index(src)
            if self._gloo is None:  # phantom mode: the values of small integer tensors, if carried
                return [], self._p2p_finish(tensors, j, tag)
            return [self._pairs.start(j, lambda: self._data.recv(tensors, j, tag))], None

        p = self._s.any_recvs.issue(
            peers=peers,
            tag=tag,
            nbytes=0 if self.gloo_sync else nbytes(tensors),
            tensors=tensors,
            on_source=on_source,
            nccl_env=None if self.gloo_sync else self._nccl_env,
            host=self.gloo_sync,
        )
        return self._work(p, tensors)

    def barrier(self, opts: Any = None) -> PhantoraWork:
        def start() -> list[Any]:
            return [self._data.barrier(BarrierOptions())]

        work = self._coll("barrier", 0, torch.empty(0, dtype=torch.uint8), [], start, [])
        work._host = True  # ProcessGroupNCCL's barrier work synchronises the host with the stream
        return work

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self.barrier().wait()

    def _start_coalescing(self, device: Any = None) -> None:
        """Open a group: the sends, recvs and collectives until `_end_coalescing` run as one NCCL launch on this
        group's communicator (ProcessGroupNCCL's coalescing): the sends and recvs share its p2p connections and
        start together on the group's stream (`launch`, bridge/stream_order.py); the collectives are held and sent
        at the block's end as NCCL's group of them (coalesce_block.py)."""
        self._coalescing = []
        self._held = []
        self._launch = next(_LAUNCH_IDS)
        self._p2p_group(self._ranks)

    def _end_coalescing(self, device: Any = None) -> PhantoraWork:
        self._send_held()
        pending, self._coalescing = self._coalescing or [], None
        self._s.nccl_group_end(self._launch, self._ranks, self._nccl_env)  # its p2p plans' host launches
        self._launch = None
        self._p2p_group(None)
        return PhantoraWork(self._s, pending, [], host=self.gloo_sync, group=self)

    def _send_held(self) -> None:
        """The block's held collectives as one coalesced call of its launch, whatever their kinds, reductions and
        roots (NCCL's group of them: one ncclGroupEnd, one plan); each call's work then waits for it."""
        held, self._held = self._held or [], None
        if not held:
            return
        m = merged(held)
        p = self._issue(
            m["kind"], m["name"], m["size"], m["dtype_of"], m["tensors"], m["start"], m["finalize"], m["root"],
            m["redop"], m["group_sizes"], m["group_dtypes"], m["sync"], m["cuda_stream"],
            group_kinds=m["group_kinds"], group_redops=m["group_redops"], group_roots=m["group_roots"],
        )  # fmt: skip
        for c in held:
            c.work._pending.append(p)
            c.work.unsent = False
        if self._coalescing is not None:
            self._coalescing.append(p)

    def _lone_on_group(self) -> bool:
        """Under eager init (`init_process_group(device_id=...)`) ProcessGroupNCCL runs even a lone send/recv on
        the group's communicator, not a 2-rank one: open a group of one op on it (True), unless one is open."""
        if not EAGER_INIT[0] or self._p2p_open:
            return False
        self._p2p_group(self._ranks)
        return True

    def _p2p_group(self, comm: tuple[int, ...] | None) -> None:
        """Tell the network client a p2p group opened on `comm` (None: closed); a client without groups (no
        network, graph replay) ignores it."""
        self._p2p_open = comm is not None
        tell = getattr(self._s.client, "p2p_group", None)
        if tell is not None:
            tell(comm)

    def shutdown(self) -> None:
        """Nothing to release beyond the inner gloo group, which Python frees."""

    def abort(self) -> None:
        """Collectives are simulated; an abort has nothing to cancel."""


_STREAM_IDS = itertools.count(1)  # this process's process groups, each one NCCL stream
_LAUNCH_IDS = itertools.count(1)  # this process's coalescing blocks, each one NCCL group launch

_COLLECTIVES = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "all_gather_single",
    "allgather_coalesced",
    "all_gather_single_coalesced",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "all_to_all_single",
    "alltoall",
    "gather",
    "scatter",
    "send",
    "recv",
)


def _sync_call(
    g: PhantoraProcessGroup,
    kind: str,
    tensors: list[torch.Tensor],
    start: Callable[[], list[Any]],
    finalize: Callable[[], None] | None,
    name: str | None,
) -> dict[str, Any]:
    """`RankSession.issue`'s arguments for a plain gloo group's collective (real mode): gloo moves the data (`start`),
    and the network sees a synchronisation of zero bytes, named `gloo_<kind>`, that ends at its latest member's issue
    (the coordinator's collective with no flows), following no CUDA stream (`host`)."""
    return dict(
        kind=kind, name=f"gloo_{name or kind}", group=g.global_ranks, nbytes=0, dtype="uint8", root=None,
        tensors=tensors, start_inner=start, finalize=finalize, stream=g._stream, pg=g._pg, host=True,
    )  # fmt: skip


def _sync_p2p(
    g: PhantoraProcessGroup, peer: int, is_send: bool, tag: int, tensors: list[torch.Tensor], start: Any
) -> dict[str, Any]:
    """`RankSession.issue_p2p`'s arguments for a plain gloo group's send or recv (real mode): zero network bytes, done
    once both ends have issued it (gloo's send completes once its receiver has posted the receive)."""
    stream, _ = g._p2p_stream(peer)
    return dict(
        peer=g.global_ranks[peer], is_send=is_send, tag=tag, nbytes=0, tensors=tensors, start_inner=start,
        stream=stream, pg=g._pair_pg(g.global_ranks[peer]), host=True,
    )  # fmt: skip


def _find_wrappers(x: Any, into: dict[int, torch.Tensor]) -> None:
    """The SimCudaTensors in `x` (nested lists and tuples), by the id of their data.

    A module function, not a recursive closure: a closure that calls itself is a reference cycle, which
    would keep the collective's tensors (gigabytes of all-gather outputs) alive until Python's cycle
    collector runs, long after the program dropped them.
    """
    if isinstance(x, SimCudaTensor):
        into[id(x.elem)] = x
    elif isinstance(x, list | tuple):
        for item in x:
            _find_wrappers(item, into)


def _on_data(method: Callable[..., PhantoraWork]) -> Callable[..., PhantoraWork]:
    """A collective of the simulated CUDA device's tensors runs on their data; its result keeps the wrappers."""

    @functools.wraps(method)
    def run(self: PhantoraProcessGroup, *args: Any) -> PhantoraWork:
        wrappers: dict[int, torch.Tensor] = {}
        _find_wrappers(args, wrappers)
        if not wrappers:
            return method(self, *args)
        with tensor_values.wrapped_as(wrappers):
            work = method(self, *simcuda.unwrap(args))
        work._result = [wrappers.get(id(t), t) for t in work._result]
        return work

    return run


def _op_mode(method: Callable[..., PhantoraWork]) -> Callable[..., PhantoraWork]:
    """The call's `asyncOp` (its options; C++'s default, True, without them) for `_coll`: async_op=False runs on
    the caller's current stream (ProcessGroupNCCL, torch >= 2.8)."""

    @functools.wraps(method)
    def run(self: PhantoraProcessGroup, *args: Any, **kwargs: Any) -> PhantoraWork:
        opts = next((a for a in (*args, *kwargs.values()) if hasattr(a, "asyncOp")), None)
        self._sync = opts is not None and not opts.asyncOp
        try:
            return method(self, *args, **kwargs)
        finally:
            self._sync = False

    return run


for _name in _COLLECTIVES:
    setattr(PhantoraProcessGroup, _name, _op_mode(_on_data(getattr(PhantoraProcessGroup, _name))))
PhantoraProcessGroup._allgather_base = PhantoraProcessGroup.all_gather_single
PhantoraProcessGroup.allgather_into_tensor_coalesced = PhantoraProcessGroup.all_gather_single_coalesced
PhantoraProcessGroup._reduce_scatter_base = PhantoraProcessGroup.reduce_scatter_single
PhantoraProcessGroup.reduce_scatter_tensor_coalesced = PhantoraProcessGroup.reduce_scatter_single_coalesced
PhantoraProcessGroup.alltoall_base = PhantoraProcessGroup.all_to_all_single


def create_backend(common: Any, backend_options: Any = None) -> PhantoraProcessGroup:
    """The `register_backend` factory (extended API: it receives the group's global ranks)."""
    s = _session.require()
    nccl_surface.note_options(backend_options)  # a program's ProcessGroupNCCL.Options: what is not modelled
    ranks = list(common.global_ranks_in_group) or list(range(common.group_size))
    return PhantoraProcessGroup(common.store, common.group_rank, common.group_size, common.timeout, ranks, s)


def register() -> None:
    """Register the `phantora` backend with torch.distributed (idempotent)."""
    if "PHANTORA" not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True, devices=["cpu", "cuda"])


_REPLACED = (None, "", "undefined", "nccl", "cuda:nccl", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo")
_GLOO = ("gloo", "cpu:gloo")  # phantora in phantom mode too (`_map_backend`)


def _map_backend(backend: Any, phantom: bool = False, groups: bool = False) -> Any:
    """NCCL (alone, or as the CUDA half of ``"cuda:nccl,cpu:gloo"``) becomes phantora; plain gloo stays gloo,
    but in phantom mode, where it becomes phantora too: its ranks share no store to meet through (each has a
    process-local one), so gloo's creation waited for its peers until the run's timeout, and phantom tensors
    hold no data to move. With `groups` (a rank of a run) plain gloo becomes phantora in real mode too, a
    `gloo_sync` group: a rank blocked in a gloo call the coordinator knew nothing of kept the network from passing
    its clock while its peer waited for a simulated call, and the run hung.

    A group with one backend per device is one phantora group: torch lets a Python process group
    stand for the whole group, so its CPU tensors (metadata) are simulated collectives too, whose
    data still moves over gloo in real mode.
    """
    text = "" if backend is None else str(backend).lower().replace(" ", "")
    return BACKEND if backend is None or text in _REPLACED or ((phantom or groups) and text in _GLOO) else backend


def _is_gloo(backend: Any) -> bool:
    """The request is plain gloo ("gloo", "cpu:gloo"; any case and spacing)."""
    return backend is not None and str(backend).lower().replace(" ", "") in _GLOO


def _phantom() -> bool:
    s = _session.current()
    return s is not None and s.phantom


def use_as_default() -> None:
    """Make `phantora` the default backend: init_process_group() and "nccl" requests get it; "gloo" stays gloo."""
    from phantora.runtime import backend_name

    register()
    dist.Backend.default_device_backend_map["cpu"] = BACKEND
    dist.Backend.default_device_backend_map["cuda"] = BACKEND
    c10d = dist.distributed_c10d
    if getattr(c10d.init_process_group, "_phantora", False):
        return
    orig_init, orig_new, orig_split = c10d.init_process_group, c10d.new_group, c10d.split_group

    @functools.wraps(orig_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        EAGER_INIT[0] = kwargs.get("device_id") is not None
        s = _session.current()
        if s is not None and s.phantom and not args and "store" not in kwargs and "init_method" not in kwargs:
            # phantom groups exchange nothing: a process-local store, no rendezvous with other processes
            kwargs.update(store=dist.HashStore(), rank=s.rank, world_size=s.world_size)
        phantom = s is not None and s.phantom
        out = orig_init(_map_backend(backend, phantom, groups=s is not None), *args, **kwargs)
        pg = c10d._get_default_group()
        if isinstance(pg, PhantoraProcessGroup):
            pg.torch_backend = backend_name.cuda_name(backend, kwargs.get("device_id"))
            pg.gloo_sync = not phantom and _is_gloo(backend)
            pg.plain_gloo = _is_gloo(backend)
        return out

    @functools.wraps(orig_new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("backend", args[2] if len(args) > 2 else None)
        if "backend" in kwargs:
            kwargs["backend"] = _map_backend(kwargs["backend"], _phantom(), groups=True)
        elif len(args) > 2:
            args = (*args[:2], _map_backend(args[2], _phantom(), groups=True), *args[3:])
        pg = orig_new(*args, **kwargs)
        local = kwargs.get("use_local_synchronization", args[4] if len(args) > 4 else False)
        mirror_groups.note(kwargs.get("ranks", args[0] if args else None), bool(local))
        if asked and isinstance(pg, PhantoraProcessGroup):  # no backend: the default group's name (name_of)
            pg.torch_backend = backend_name.cuda_name(asked)
            pg.gloo_sync = not _phantom() and _is_gloo(asked)
            pg.plain_gloo = _is_gloo(asked)
        elif isinstance(pg, PhantoraProcessGroup):  # the default group's backend, gloo too
            pg.gloo_sync = getattr(c10d._get_default_group(), "gloo_sync", False)
            pg.plain_gloo = getattr(c10d._get_default_group(), "plain_gloo", False)
        return pg

    @functools.wraps(orig_split)
    def split_group(*args: Any, **kwargs: Any) -> Any:
        pg = orig_split(*args, **kwargs)
        parent = kwargs.get("parent_pg", args[0] if args else None) or c10d._get_default_group()
        splits = kwargs.get("split_ranks", args[1] if len(args) > 1 else None) or []
        mirror_groups.note_split([c10d.get_global_rank(parent, r) for r in range(parent.size())], splits)
        return pg

    init_process_group._phantora = True  # type: ignore[attr-defined]
    batch = _grouped_batch(c10d.batch_isend_irecv)
    default_for = _nccl_for_cuda(c10d.get_default_backend_for_device)
    get_backend = backend_name.get_backend_as_cuda(c10d.get_backend, PhantoraProcessGroup)
    get_config = backend_name.get_backend_config_as_cuda(c10d.get_backend_config, PhantoraProcessGroup)
    default_device = backend_name.default_device_as_cuda(c10d._get_pg_default_device, PhantoraProcessGroup)
    c10d._new_process_group_helper = backend_name.bind_device(c10d._new_process_group_helper, PhantoraProcessGroup)
    _rebind(
        {
            "init_process_group": (orig_init, init_process_group),
            "new_group": (orig_new, new_group),
            "split_group": (orig_split, split_group),
            "batch_isend_irecv": (c10d.batch_isend_irecv, batch),
            "get_default_backend_for_device": (c10d.get_default_backend_for_device, default_for),
            "get_backend": (c10d.get_backend, get_backend),
            "get_backend_config": (c10d.get_backend_config, get_config),
            "_get_pg_default_device": (c10d._get_pg_default_device, default_device),
        }
    )
    if not hasattr(dist, "set_timeout"):  # newer than this torch; torchtitan 0.3.0 calls it after step 1
        dist.set_timeout = _set_timeout


def _rebind(swaps: dict[str, tuple[Any, Any]]) -> None:
    """Put each replacement wherever torch holds the original under its name: c10d and torch.distributed, and every
    torch module already loaded that imported it by name (torch.distributed.device_mesh binds init_process_group and
    new_group at import, and the forkserver preloads it before this runs: `init_device_mesh` alone would otherwise
    take torch's own rendezvous, which in phantom mode waits for ranks that dedup never starts)."""
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("torch"):
            continue
        for name, (orig, new) in swaps.items():
            if getattr(mod, name, None) is orig:
                setattr(mod, name, new)


def _nccl_for_cuda(orig: Callable[..., str]) -> Callable[..., str]:
    """`get_default_backend_for_device` as a CUDA build answers it: "nccl" for a cuda device (programs pass it to
    `init_process_group`, which gives them the phantora backend for it); other devices as torch's map says."""

    @functools.wraps(orig)
    def get_default_backend_for_device(device: str | torch.device) -> str:
        backend = orig(device)
        kind = device.type if isinstance(device, torch.device) else torch.device(device).type
        return "nccl" if kind == "cuda" and backend == BACKEND else backend

    return get_default_backend_for_device


EAGER_INIT = [False]  # the default group was initialised eagerly (device_id=): p2p runs on each group's communicator


def _grouped_batch(orig: Callable[..., Any]) -> Callable[..., Any]:
    """`batch_isend_irecv` as ProcessGroupNCCL runs it: one NCCL group on the ops' group's communicator and stream,
    one launch. torch only coalesces for a C++ ProcessGroup whose backend says so; a phantora group stands alone, so
    torch issues the ops one by one, and this tells the network client they form one group (`_p2p_group`) and
    gives them one launch id (bridge/stream_order.py: they start together, the next call waits for all)."""

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        group = (p2p_op_list[0].group if p2p_op_list else None) or dist.distributed_c10d._get_default_group()
        if not isinstance(group, PhantoraProcessGroup):
            return orig(p2p_op_list)
        group._p2p_group(group.global_ranks)
        launch, group._launch = group._launch, next(_LAUNCH_IDS)  # the batch: one NCCL group launch
        try:
            return orig(p2p_op_list)
        finally:
            group._s.nccl_group_end(group._launch, group._ranks, group._nccl_env)  # its plans' host launches
            group._launch = launch
            group._p2p_group(None)

    return batch_isend_irecv


def _set_timeout(timeout: Any, group: Any = None) -> None:
    """`torch.distributed.set_timeout` for the versions of torch that lack it. A rank's collectives have
    phantora's own timeouts (the bridge's peer timeout), so a group's NCCL watchdog timeout changes nothing."""
