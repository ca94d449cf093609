"""Functional collectives (`torch.ops._c10d_functional`, used by DTensor and torch.compile) on phantora groups.

Their C++ kernels call ProcessGroup methods that a Python ProcessGroup cannot override, so the
dispatch mode routes each op here instead: allocate the output, call the phantora group, and
return the output in flight. `wait_tensor` joins it like any other data dependency.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllreduceOptions,
    BroadcastOptions,
    ReduceScatterOptions,
)

from phantora.runtime.session import RankSession
from phantora.runtime.simcuda.devices import NotSimulatedError

aten = torch.ops.aten
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def wrap_async(session: RankSession, t: torch.Tensor) -> torch.Tensor:
    """`_wrap_tensor_autograd`: the collective's output in an AsyncCollectiveTensor, as torch's kernel does.

    The wrapper does not share its input's storage, so the ops that read it could not find the
    collective in flight by its memory: the wrap is where the result is consumed. Join here. A
    simulated CUDA tensor is wrapped as it is (not its host data), so the result stays on the GPU.
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if session.by_storage:
        session.join_tensors([t])
    return AsyncCollectiveTensor(t)


def _group(name: Any) -> Any:
    from phantora.runtime.backend import PhantoraProcessGroup

    pg = name if isinstance(name, dist.ProcessGroup) else dist.distributed_c10d._resolve_process_group(name)
    return pg if isinstance(pg, PhantoraProcessGroup) else None


def _reduce_op(name: str) -> dist.ReduceOp:
    op = _OPS.get(str(name).lower())
    if op is None:
        raise NotSimulatedError(
            f"a functional collective with reduce op {name!r} on a phantora process group is not simulated; "
            f"phantora simulates the ops {', '.join(_OPS)}"
        )
    return op


def _op(name: str) -> AllreduceOptions:
    o = AllreduceOptions()
    o.reduceOp = _reduce_op(name)
    return o


def _rs_opts(name: str) -> ReduceScatterOptions:
    o = ReduceScatterOptions()
    o.reduceOp = _reduce_op(name)
    return o


def _copy(session: RankSession, t: torch.Tensor) -> torch.Tensor:
    """The out-of-place collectives copy their input first: a real copy kernel on the compute lane."""
    out = t.clone(memory_format=torch.contiguous_format)
    session.charge("aten.clone", session.model.cost(aten.clone.default, (t,), {}, out))
    return out


def _gathered(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.new_empty((t.shape[0] * n, *t.shape[1:]))


def _scattered(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.new_empty((t.shape[0] // n, *t.shape[1:]))


def run(session: RankSession, func: Any, args: tuple, kwargs: dict) -> Any:
    """Execute one `_c10d_functional` op; fall through to torch for groups that are not phantora's."""
    name = func.overloadpacket.__name__
    if name == "wait_tensor":
        if session.by_storage:
            session.join_tensors([args[0]])
        return func(*args, **kwargs)
    if name == "_wrap_tensor_autograd":
        return wrap_async(session, args[0])
    group_arg = kwargs.get("group_name", args[-1] if args else None)
    pg = _group(group_arg)
    if pg is None:
        return func(*args, **kwargs)
    handler = _HANDLERS.get(name)
    if handler is None:
        raise NotSimulatedError(
            f"torch.ops._c10d_functional.{name} on a phantora process group (a functional collective, as DTensor and "
            f"torch.compile issue) is not simulated; phantora simulates {', '.join(sorted(_HANDLERS))}: use one of "
            "those, or the torch.distributed call of the same name"
        )
    with session.internal():
        return handler(session, pg, *args, **kwargs)


def _all_reduce(s: RankSession, pg: Any, input: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    out = _copy(s, input)
    pg.allreduce([out], _op(op))
    return out


def _all_reduce_(s: RankSession, pg: Any, input: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    pg.allreduce([input], _op(op))
    return input


def _all_reduce_coalesced(
    s: RankSession, pg: Any, inputs: list[torch.Tensor], op: str, group: Any
) -> list[torch.Tensor]:
    outs = [_copy(s, t) for t in inputs]
    pg.allreduce_coalesced(outs, _op(op))
    return outs


def _all_reduce_coalesced_(
    s: RankSession, pg: Any, inputs: list[torch.Tensor], op: str, group: Any
) -> list[torch.Tensor]:
    pg.allreduce_coalesced(list(inputs), _op(op))
    return inputs


def _all_gather(s: RankSession, pg: Any, input: torch.Tensor, n: int, group: Any, *, out: Any = None) -> torch.Tensor:
    input = input.contiguous()
    out = _gathered(input, n) if out is None else out
    pg.all_gather_single(out, input)
    return out


def _all_gather_coalesced(
    s: RankSession, pg: Any, inputs: list[torch.Tensor], n: int, group: Any
) -> list[torch.Tensor]:
    inputs = [t.contiguous() for t in inputs]
    outs = [_gathered(t, n) for t in inputs]
    pg.all_gather_single_coalesced(outs, inputs)
    return outs


def _reduce_scatter(
    s: RankSession, pg: Any, input: torch.Tensor, op: str, n: int, group: Any, *, out: Any = None
) -> torch.Tensor:
    input = input.contiguous()
    out = _scattered(input, n) if out is None else out
    pg.reduce_scatter_single(out, input, _rs_opts(op))
    return out


def _reduce_scatter_coalesced(
    s: RankSession, pg: Any, inputs: list[torch.Tensor], op: str, n: int, group: Any
) -> list[torch.Tensor]:
    inputs = [t.contiguous() for t in inputs]
    outs = [_scattered(t, n) for t in inputs]
    pg.reduce_scatter_single_coalesced(outs, inputs, _rs_opts(op))
    return outs


def _all_to_all(
    s: RankSession, pg: Any, input: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
) -> torch.Tensor:
    input = input.contiguous()
    out = input.new_empty((int(sum(out_splits)), *input.shape[1:]))
    pg.all_to_all_single(out, input, [int(x) for x in out_splits], [int(x) for x in in_splits])
    return out


def _broadcast(s: RankSession, pg: Any, input: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    out = _copy(s, input)
    o = BroadcastOptions()
    o.rootRank = src
    pg.broadcast([out], o)
    return out


def _broadcast_(s: RankSession, pg: Any, input: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    o = BroadcastOptions()
    o.rootRank = src
    pg.broadcast([input], o)
    return input


def _isend(s: RankSession, pg: Any, tensor: torch.Tensor, dst: int, tag: int, group: Any) -> torch.Tensor:
    pg.send([tensor], dst, tag)
    return tensor


def _irecv(s: RankSession, pg: Any, tensor: torch.Tensor, src: int, tag: int, group: Any) -> torch.Tensor:
    pg.recv([tensor], src, tag)
    return tensor


def _batch_p2p(
    s: RankSession, pg: Any, ops: list[str], peers: list[int], tags: list[int], tensors: list[torch.Tensor], group: Any
) -> list[torch.Tensor]:
    for op, peer, tag, t in zip(ops, peers, tags, tensors, strict=True):
        if op.startswith("isend") or op == "send":
            pg.send([t], peer, tag)
        else:
            pg.recv([t], peer, tag)
    return list(tensors)


_HANDLERS = {
    "all_reduce": _all_reduce,
    "all_reduce_": _all_reduce_,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "all_reduce_coalesced_": _all_reduce_coalesced_,
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_out": _all_gather,
    "all_gather_into_tensor_coalesced": _all_gather_coalesced,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_out": _reduce_scatter,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_coalesced,
    "all_to_all_single": _all_to_all,
    "broadcast": _broadcast,
    "broadcast_": _broadcast_,
    "isend": _isend,
    "irecv": _irecv,
    "batch_p2p_ops": _batch_p2p,
}
