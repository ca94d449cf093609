"""Small integer tensors carry their values through collectives in phantom mode (the value channel).

In phantom mode device tensors are meta, except integer data copied from the host, which keeps its values
(dispatch.py) because programs read them: DTensor's RNG tracker broadcasts rank 0's generator state and
compares it with its own, a pipeline schedule votes, a program sends a count with `dist.send`. On a GPU a
broadcast or a recv overwrites the receiver's values; here the collective is timed as any other, and the values
travel beside it through the coordinator (bridge.values, msgpack on the wire):

- which collectives: those whose tensors are integers or booleans of at most `LIMIT` bytes in all, a property
  of shapes and dtypes, so every member of an SPMD group agrees on it without asking (an all-to-all's members
  may hold parts of other sizes, so every member of an integer one posts and takes: `all_to_all`);
- a sender (a broadcast's root, a send, every member of an all-reduce, all-gather or all-to-all) posts its values,
  or nil when its tensors are phantom, when its plan is made here: *before* the backend issues the collective.
  A rank's messages reach the coordinator in the order sent (one socket), so the post is on the board before
  the collective can complete, and a receiver that asks once it has completed always finds it;
- once the collective completes, each receiver takes the values and writes them into its tensors; a phantom
  receiver that owns its storage (a fresh `torch.empty` / `zeros` on the device) becomes a tensor with values,
  as a GPU buffer holds what it received. If a sender had none, the receiver's tensors are left as they are.

The keys (`next_key`) are shared with the object collectives (object_values): one sequence per group (or
(src, dst) pair) and process group over it (`pg`, RankSession.comm_of: two groups over the same ranks are two
communicators, posting apart), so that the two never post under the same key. A send and its recv take theirs from
a sequence of their own per (src, dst, tag, pg), as the simulator matches them, in negative keys (`_p2p_key`): a
recv of another tag, or a collective of the 2-rank group (src, dst), issued in another order on the two ranks, never
takes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack
import torch
import torch.distributed as dist

from phantora.runtime import session as _session
from phantora.runtime.simcuda.devices import NotSimulatedError
from phantora.runtime.simcuda.tensor import SimCudaTensor

LIMIT = 1 << 22  # bytes in all: counts, votes, RNG states, routing maps (kept_values.NUMEL booleans); see the doc
_quiet = 0  # > 0 inside `quiet()`: object_values' own timed collectives carry nothing themselves
_wrappers: dict[int, torch.Tensor] = {}  # inside `wrapped_as`: the device tensor of each datum, by id
_keys: dict[tuple[tuple[int, ...], int], int] = {}  # per (group or (src, dst) pair, pg): value-carrying calls so far

Finish = Callable[[], None]
Key = tuple[int, int]  # (the number of a call's values on its group, its process group `pg` over those ranks)


def next_key(group: tuple[int, ...], pg: int = 0) -> Key:
    """The key of this rank's next value-carrying call on `group`'s process group `pg` (RankSession.comm_of: 0 for
    the first over those ranks), the same sequence on every member."""
    n = _keys.get((group, pg), 0)
    _keys[(group, pg)] = n + 1
    return n, pg


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Collectives issued inside carry no values (object_values times its exchanges with phantom tensors)."""
    global _quiet
    _quiet += 1
    try:
        yield
    finally:
        _quiet -= 1


@contextlib.contextmanager
def wrapped_as(wrappers: dict[int, torch.Tensor]) -> Iterator[None]:
    """The backend runs a collective on its tensors' data; inside, `targets` finds the device tensors again (a
    phantom receiver gets its values as new data: its wrapper's)."""
    global _wrappers
    before, _wrappers = _wrappers, wrappers
    try:
        yield
    finally:
        _wrappers = before


def targets(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors the values are written to: each datum's device tensor, if it has one."""
    return [_wrappers.get(id(t), t) for t in tensors]


def _data(t: torch.Tensor) -> torch.Tensor:
    return t.elem if isinstance(t, SimCudaTensor) else t


def integral(tensors: Sequence[torch.Tensor]) -> bool:
    """Phantom mode, and integer or boolean tensors: a collective whose members all decide alike by dtype alone."""
    s = _session.current()
    if s is None or not s.phantom or _quiet or not tensors:
        return False
    return not any(t.is_floating_point() or t.is_complex() for t in tensors)


def _small(tensors: Sequence[torch.Tensor]) -> bool:
    return sum(t.numel() * t.element_size() for t in tensors) <= LIMIT


def carried(tensors: Sequence[torch.Tensor]) -> bool:
    """Do these tensors' values travel with their collective (phantom mode, small integer or boolean tensors)?"""
    return integral(tensors) and _small(tensors)


def _raw(d: torch.Tensor) -> bytes:
    """A host tensor's values as its bytes, flat, in the machine's byte order (every rank runs on this host)."""
    return d.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _values(tensors: Sequence[torch.Tensor]) -> bytes:
    """msgpack of each tensor's values (its raw bytes: a list of numbers costs 10-50x more to pack and unpack at
    a routing map's size), or nil if any is phantom."""
    datas = [_data(t) for t in tensors]
    if any(d.is_meta for d in datas):
        return msgpack.packb(None)
    return msgpack.packb([_raw(d) for d in datas], use_bin_type=True)


def _decode(data: bytes | None) -> list[bytes] | None:
    return None if data is None else msgpack.unpackb(data, raw=False)


def _host(raw: bytes, dtype: torch.dtype) -> torch.Tensor:
    """Flat values of `dtype` from their bytes."""
    if not raw:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)


def _owns_storage(d: torch.Tensor) -> bool:
    return d.storage_offset() == 0 and d.is_contiguous() and d.untyped_storage().nbytes() == d.numel() * d.itemsize


def write(t: torch.Tensor, values: bytes | torch.Tensor) -> None:
    """Put `values` (flat: raw bytes of `t`'s dtype, or a host tensor) into `t`: into its data, or, for a phantom
    tensor on the device that owns its storage, as its new data (a host tensor: it now holds values). Others (a
    phantom view) are left phantom."""
    d = _data(t)
    flat = _host(values, t.dtype) if isinstance(values, bytes) else values.to(t.dtype)
    host = flat.reshape(t.shape)
    if not d.is_meta:
        d.copy_(host)
    elif isinstance(t, SimCudaTensor) and _owns_storage(d):
        t.elem = host


def _client() -> Any:
    client = _session.require().client
    if not hasattr(client, "post_value"):
        raise NotSimulatedError(f"values of a collective in phantom mode need the value channel: {type(client)}")
    return client


def _post(group: tuple[int, ...], key: Key, data: bytes, reads: bool) -> None:
    """Post now: the caller issues the collective after (see the module doc)."""
    _client().post_value(group=group, key=key[0], data=data, reads=reads, **_pg(key))


def _take(group: tuple[int, ...], key: Key) -> list[list[bytes] | None]:
    return [_decode(v) for v in _client().take_values(group=group, key=key[0], **_pg(key))]


def _pg(key: Key) -> dict[str, int]:
    """The client's `pg` argument of `key`: given only when not the first process group (older clients lack it)."""
    return {"pg": key[1]} if key[1] else {}


def broadcast(ranks: tuple[int, ...], me: int, root: int, tensors: list[torch.Tensor], pg: int = 0) -> Finish | None:
    """The root's values into every member's tensors (the root posts them now; the others' finish); `pg`: its
    process group over `ranks` (every function here takes it: `next_key`)."""
    key = next_key(ranks, pg)
    if me == root:
        _post(ranks, key, _values(tensors), reads=False)
        return None
    into = targets(tensors)

    def finish() -> None:
        got = _take(ranks, key)[root]
        if got is not None:
            for t, v in zip(into, got, strict=True):
                write(t, v)

    return finish


def _p2p_key(src: int, dst: int, tag: int, pg: int = 0) -> Key:
    """The key of the next send or recv of (src, dst, tag): one sequence per tag, as the simulator matches a
    send with its recv, and negative, apart from the group sequences (`next_key`) of a 2-rank group (src, dst) and
    of object_values' sends on the pair; `pg`: the process group of those holding both (RankSession.comm_of)."""
    seq = next_key((src, dst, -1, tag), pg)[0]  # -1: no group of ranks is this tuple
    return -1 - ((seq << 32) | (tag & 0xFFFFFFFF)), pg


def send(src: int, dst: int, tensors: list[torch.Tensor], tag: int = 0, pg: int = 0) -> None:
    """A send's values, posted now for the pair (src, dst) (global ranks) under its tag's next key."""
    _post((src, dst), _p2p_key(src, dst, tag, pg), _values(tensors), reads=False)


def recv(src: int, dst: int, tensors: list[torch.Tensor], tag: int = 0, pg: int = 0) -> Finish:
    """A recv's values (the send of the same pair, tag and process group, in order), written once it completes."""
    pair = (src, dst)
    key = _p2p_key(src, dst, tag, pg)
    into = targets(tensors)

    def finish() -> None:
        got = _take(pair, key)[0]
        if got is not None:
            for t, v in zip(into, got, strict=True):
                write(t, v)

    return finish


_REDUCE: list[tuple[Any, Callable[[torch.Tensor], torch.Tensor]]] = [
    (dist.ReduceOp.SUM, lambda x: x.sum(0)),
    (dist.ReduceOp.AVG, lambda x: x.sum(0).floor_divide(x.shape[0])),  # gloo's SUM then floor division, as real mode
    (dist.ReduceOp.PRODUCT, lambda x: x.prod(0)),
    (dist.ReduceOp.MIN, lambda x: x.amin(0)),
    (dist.ReduceOp.MAX, lambda x: x.amax(0)),
]


def _reducer(op: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    for known, reduce in _REDUCE:
        if op == known:
            return reduce
    raise NotSimulatedError(f"all_reduce of integer tensors with {op} in phantom mode: SUM, AVG, PRODUCT, MIN, MAX")


def all_reduce(ranks: tuple[int, ...], tensors: list[torch.Tensor], op: Any, pg: int = 0) -> Finish:
    """Every member's values, reduced by `op` into every member's tensors (if every member had values)."""
    reduce = _reducer(op)
    key = next_key(ranks, pg)
    into = targets(tensors)
    _post(ranks, key, _values(tensors), reads=True)

    def finish() -> None:
        got = _take(ranks, key)
        if any(g is None for g in got):
            return
        for i, t in enumerate(into):
            stacked = torch.stack([_host(g[i], t.dtype) for g in got if g is not None])
            write(t, reduce(stacked).to(t.dtype))  # wraps at the dtype's width, as NCCL and gloo do

    return finish


def _write_in_rank_order(into: list[torch.Tensor], parts: list[bytes]) -> None:
    """One part from each member, in rank order: into `into` one per member, or concatenated into one flat."""
    if len(into) == len(parts):
        for t, part in zip(into, parts, strict=True):
            write(t, part)
    else:
        write(into[0], b"".join(parts))


def all_gather(ranks: tuple[int, ...], inputs: list[torch.Tensor], outputs: list[torch.Tensor], pg: int = 0) -> Finish:
    """Every member's input values, concatenated in rank order into `outputs` (one per member, or one flat)."""
    key = next_key(ranks, pg)
    into = targets(outputs)
    _post(ranks, key, _values(inputs), reads=True)

    def finish() -> None:
        got = _take(ranks, key)
        if any(g is None for g in got):
            return
        _write_in_rank_order(into, [b"".join(g) for g in got if g is not None])

    return finish


def split_rows(t: torch.Tensor, rows: Sequence[int]) -> list[torch.Tensor]:
    """`t` cut along dim 0 into parts of `rows` rows each, flat (an all-to-all's split sizes, in rank order)."""
    d = _data(t)
    return [p.reshape(-1) for p in d.split(list(rows))] if d.dim() else [d.reshape(-1)]


def all_to_all(
    ranks: tuple[int, ...], me: int, parts: list[torch.Tensor], outputs: list[torch.Tensor], pg: int = 0
) -> Finish:
    """Member j's `parts[i]` into member i's outputs, from each member in rank order (`outputs`: one per member,
    or one flat), as NCCL's all-to-all leaves them; only if every member had values. Parts may differ in size
    (uneven splits), so members cannot agree on "small" alone: every member of an integral all-to-all posts (its
    values if small, else none) and takes, which keeps the group's keys in step."""
    key = next_key(ranks, pg)
    into = targets(outputs)
    _post(ranks, key, _values(parts) if _small(parts + outputs) else msgpack.packb(None), reads=True)

    def finish() -> None:
        got = _take(ranks, key)
        if any(g is None for g in got):
            return
        _write_in_rank_order(into, [g[me] for g in got if g is not None])

    return finish
