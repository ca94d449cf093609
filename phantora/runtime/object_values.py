"""Object collectives in phantom mode: real values through the value channel, time through the network model.

torch's object collectives (`all_gather_object`, `gather_object`, `broadcast_object_list`, `scatter_object_list`,
`send_object_list`, `recv_object_list`) pickle objects into uint8 tensors, exchange their sizes (int64 tensors)
and then the bytes. Phantom tensors carry no values, so in phantom mode each helper here:
1. pickles as torch does (`_object_to_tensor`: the same bytes) and posts them to the coordinator (`bridge.values`,
   msgpack on the wire; the coordinator never unpickles);
2. issues the same tensor collectives torch would, of the same sizes, on phantom tensors: the size exchange,
   then the bytes (the network model times them; they appear in the trace as any collective);
3. once the size exchange is done (every member has posted), takes the members' bytes and unpickles them as
   torch does (`_tensor_to_object`).
Rank deduplication: a mirror rank's value is the live rank's it mirrors (bridge.values).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from phantora.runtime import session as _session
from phantora.runtime.simcuda.devices import NotSimulatedError
from phantora.runtime.tensor_values import Key, next_key, quiet

_MARK = "_phantora_object_values"
_next_key = next_key  # per group (or (src, dst) pair), shared with the tensors that carry values


def _client() -> Any:
    client = _session.require().client
    if not hasattr(client, "post_value"):
        raise NotSimulatedError(
            f"an object collective in phantom mode needs the value channel, which {type(client).__name__} lacks; "
            "run with the bridge (the default network) or without --phantom"
        )
    return client


def _members(group: Any) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group or c10d._get_default_group()))


def _pg(group: Any, peer: int | None = None) -> int:
    """Which of the rank's process groups over `group`'s ranks it is (with a global `peer`: of those holding this
    rank and `peer`), as phantora's backend numbers it (`PhantoraProcessGroup.values_pg`); 0 for another backend."""
    of = getattr(group or c10d._get_default_group(), "values_pg", None)
    return int(of(peer)) if of is not None else 0


def _opt(key: Key) -> dict[str, int]:
    """The client's `pg` argument of `key`, given only when not the first process group."""
    return {"pg": key[1]} if key[1] else {}


def pickled(obj: Any, group: Any = None) -> bytes:
    """`obj` as torch's object collectives pickle it (the bytes they send)."""
    tensor, _ = c10d._object_to_tensor(obj, torch.device("cpu"), group)
    return bytes(tensor.numpy().tobytes())


def unpickled(data: bytes, group: Any = None) -> Any:
    """The object torch's object collectives rebuild from `data`."""
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return c10d._tensor_to_object(tensor, len(data), group)


def _meta(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device="meta")


def _sizes(n: int = 1) -> torch.Tensor:
    return _meta(n, torch.int64)


def _exchange(group: Any, data: bytes | None, reads: bool = True) -> tuple[tuple[int, ...], Key]:
    """Post this rank's bytes (None: none) for its next object collective on `group`; the group and key."""
    members = _members(group)
    key = _next_key(members, _pg(group))
    if data is not None:
        _client().post_value(group=members, key=key[0], data=data, reads=reads, **_opt(key))
    return members, key


def _take(members: tuple[int, ...], key: Key) -> list[bytes | None]:
    return list(_client().take_values(group=members, key=key[0], **_opt(key)))


def _root(group: Any, rank: int | None, group_rank: int | None, what: str) -> int:
    """The group rank of a root given as a global `rank` or a `group_rank`."""
    if group_rank is not None:
        return int(group_rank)
    if rank is None:
        raise ValueError(f"{what}: give the root as a global rank or a group rank")
    return dist.get_group_rank(group or c10d._get_default_group(), rank)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """torch's `all_gather_object`: sizes all-gathered (int64), then the bytes (uint8, padded to the largest)."""
    members, key = _exchange(group, pickled(obj, group))
    n = len(members)
    dist.all_gather([_sizes() for _ in range(n)], _sizes(), group=group)
    values = _take(members, key)
    largest = max(len(v or b"") for v in values)
    dist.all_gather([_meta(largest, torch.uint8) for _ in range(n)], _meta(largest, torch.uint8), group=group)
    for i, v in enumerate(values):
        object_list[i] = unpickled(v or b"", group)


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """torch's `gather_object`: sizes all-gathered, then the bytes gathered to the root (padded to the largest)."""
    root = _root(group, dst, group_dst if dst is not None or group_dst is not None else 0, "gather_object")
    members, key = _exchange(group, pickled(obj, group))
    n = len(members)
    dist.all_gather([_sizes() for _ in range(n)], _sizes(), group=group)
    values = _take(members, key)
    largest = max(len(v or b"") for v in values)
    me = dist.get_rank(group)
    outs = [_meta(largest, torch.uint8) for _ in range(n)] if me == root else None
    dist.gather(_meta(largest, torch.uint8), outs, group=group, group_dst=root)
    if me == root:
        if object_gather_list is None:
            raise ValueError("gather_object: the root needs an object_gather_list")
        for i, v in enumerate(values):
            object_gather_list[i] = unpickled(v or b"", group)


def _pack(objects: Sequence[Any], group: Any) -> bytes:
    """A list of objects as one msgpack list of torch's pickled bytes (the channel's payload)."""
    return msgpack.packb([pickled(o, group) for o in objects], use_bin_type=True)


def _unpack(data: bytes | None, what: str) -> list[bytes]:
    if data is None:
        raise NotSimulatedError(f"{what}: the root posted no value (did every rank call it on the same group?)")
    return list(msgpack.unpackb(data, raw=False))


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """torch's `broadcast_object_list`: the sizes broadcast (int64 each), then the bytes (their sum)."""
    root = _root(group, src, group_src if src is not None or group_src is not None else 0, "broadcast_object_list")
    me = dist.get_rank(group)
    members, key = _exchange(group, _pack(object_list, group) if me == root else None)
    dist.broadcast(_sizes(len(object_list)), group=group, group_src=root)
    parts = _unpack(_take(members, key)[root], "broadcast_object_list")
    dist.broadcast(_meta(sum(len(p) for p in parts), torch.uint8), group=group, group_src=root)
    if me != root:
        for i, p in enumerate(parts):
            object_list[i] = unpickled(p, group)


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """torch's `scatter_object_list`: the largest size broadcast, the bytes scattered (padded), then the sizes."""
    root = _root(group, src, group_src if src is not None or group_src is not None else 0, "scatter_object_list")
    me = dist.get_rank(group)
    if me == root and scatter_object_input_list is None:
        raise ValueError("scatter_object_list: the root needs a scatter_object_input_list")
    members, key = _exchange(group, _pack(scatter_object_input_list or [], group) if me == root else None)
    n = len(members)
    dist.broadcast(_sizes(), group=group, group_src=root)
    parts = _unpack(_take(members, key)[root], "scatter_object_list")
    largest = max((len(p) for p in parts), default=0)
    ins = [_meta(largest, torch.uint8) for _ in range(n)] if me == root else None
    dist.scatter(_meta(largest, torch.uint8), ins, group=group, group_src=root)
    dist.scatter(_sizes(), [_sizes() for _ in range(n)] if me == root else None, group=group, group_src=root)
    scatter_object_output_list[0] = unpickled(parts[me], group)


def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    device: Any = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """torch's `send_object_list`: the sizes sent (int64 each), then the bytes (their sum)."""
    peer = _root(group, dst, group_dst, "send_object_list")
    members = _members(group)
    pair = (dist.get_rank(), members[peer])
    key = _next_key(pair, _pg(group, members[peer]))
    data = _pack(object_list, group)
    _client().post_value(group=pair, key=key[0], data=data, reads=False, **_opt(key))
    dist.send(_sizes(len(object_list)), group=group, group_dst=peer)
    total = sum(len(p) for p in msgpack.unpackb(data, raw=False))
    dist.send(_meta(total, torch.uint8), group=group, group_dst=peer)


def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """torch's `recv_object_list`: the sizes received, then the bytes; returns the sender's global rank."""
    if src is None and group_src is None:
        raise NotSimulatedError("recv_object_list from any source in phantom mode: name the source rank")
    peer = _root(group, src, group_src, "recv_object_list")
    members = _members(group)
    pair = (members[peer], dist.get_rank())
    key = _next_key(pair, _pg(group, members[peer]))
    dist.recv(_sizes(len(object_list)), group=group, group_src=peer)
    parts = _unpack(_take(pair, key)[0], "recv_object_list")
    dist.recv(_meta(sum(len(p) for p in parts), torch.uint8), group=group, group_src=peer)
    for i, p in enumerate(parts):
        object_list[i] = unpickled(p, group)
    return members[peer]


def send_tensor_value(tensor: torch.Tensor, dst: int, group: Any = None) -> None:
    """`dist.send(tensor, dst)` (global `dst`) of a small integer tensor with values: they travel with it
    (tensor_values: a send of one is timed as any send)."""
    dist.send(tensor, dst=dst, group=group)


def recv_tensor_value(like: torch.Tensor, src: int, group: Any = None) -> torch.Tensor:
    """`like` (a small integer tensor on the device, phantom or not), received from global rank `src` with the
    values `send_tensor_value` sent (tensor_values)."""
    dist.recv(like, src=src, group=group)
    data = like.elem if hasattr(like, "elem") else like
    if data.is_meta:
        raise NotSimulatedError(f"a tensor value from rank {src}: the sender's tensor held none (a phantom tensor)")
    return like


_HELPERS: dict[str, Callable[..., Any]] = {
    "all_gather_object": all_gather_object,
    "gather_object": gather_object,
    "broadcast_object_list": broadcast_object_list,
    "scatter_object_list": scatter_object_list,
    "send_object_list": send_object_list,
    "recv_object_list": recv_object_list,
}


def _routed(name: str, ours: Callable[..., Any], theirs: Callable[..., Any]) -> Callable[..., Any]:
    """torch's helper, ours for a group of the phantora backend in a phantom session (gloo groups keep torch's)."""

    signature = inspect.signature(theirs)

    @functools.wraps(theirs)
    def call(*args: Any, **kwargs: Any) -> Any:
        s = _session.current()
        group = signature.bind_partial(*args, **kwargs).arguments.get("group")  # given by name or by position
        if s is None or not s.phantom or (group is not None and not _phantora_group(group)):
            return theirs(*args, **kwargs)
        with quiet():  # its timed collectives are phantom tensors: the values travel as posted here
            return ours(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _phantora_group(group: Any) -> bool:
    """A phantora group (its `phantora_group` mark: it names itself "nccl", as a CUDA group does, and this module
    cannot import its class: the backend imports the device, which imports us)."""
    try:
        backend = group._get_backend(torch.device("cpu"))
        return getattr(backend, "phantora_group", False) is True
    except Exception:  # noqa: BLE001 - a group without a CPU backend is not ours
        return False


def enable() -> None:
    """Route torch's object collectives through the value channel in phantom mode (idempotent)."""
    for name, ours in _HELPERS.items():
        theirs = getattr(c10d, name)
        if getattr(theirs, _MARK, False):
            continue
        routed = _routed(name, ours, theirs)
        setattr(c10d, name, routed)
        setattr(dist, name, routed)
