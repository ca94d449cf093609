"""torch.distributed.checkpoint (DCP) in phantom mode: each rank saves and loads its own part, unchanged programs.

Real DCP makes its ranks agree on a plan by exchanging pickled objects (gather, scatter, broadcast); in phantom mode
those carry their values through the value channel (`object_values`), timed as any collective of their size.
Deduplicated ranks are not all processes (a mirror's plan would be its live rank's), so a save does not plan
across ranks, and a deduplicated run (`deduplicated`) exchanges nothing: its gathers would pair a live rank with
its own mirror, which the network cannot run. In phantom mode, for a multi-rank run:
- `dcp.save` / `save_state_dict` run as `dcp.save(..., use_collectives=False)`, torch's own format for a checkpoint
  written without rank coordination: each rank plans alone and writes its data files (`__{rank}_N.distcp`; phantom
  tensors as data-less meta records, `_HostRecord`) and its own metadata (`__{rank}.metadata`); around that, the
  exchanges of a coordinated save run with the real objects: each rank's local plan gathered to the coordinator and
  scattered back (as soon as it is made), then after the writes each rank's write results gathered, the
  coordinator's merge of the ranks' metadata into the global `.metadata` a coordinated save writes (programs look
  for it: torchtitan finds its checkpoints by it) and its broadcast (a FileSystemWriter only);
- `dcp.load` reads the global `.metadata` (phantom or real mode wrote it) or else the rank's own (named by its rank
  in the load's group, as DCP names it), and runs DCP's own plan exchange (the default load planner's global step
  changes no plan);
- `dcp.async_save` is refused in one line (its background save is not modelled).
What real DCP does that this does not: it writes a replicated item once, on one rank (the storage model charges
its bytes over the ranks holding it: storage.py), and it scatters the coordinator's final plans, where this
scatters the ranks' local plans (the same items; the final ones add storage names).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from phantora.runtime import import_hooks
from phantora.runtime.simcuda.devices import NotSimulatedError

_MARK = "_phantora_phantom_dcp"


def _distributed(no_dist: bool = False) -> bool:
    return not no_dist and dist.is_initialized() and dist.get_world_size() > 1


def deduplicated() -> bool:
    """A run whose ranks are not all processes (rank deduplication): DCP's gathers and scatters would pair a live
    rank with its own mirror, which the network cannot run, so its ranks plan alone and exchange nothing."""
    from phantora.runtime import session

    s = session.current()
    client = getattr(s, "client", None)
    live, world = getattr(client, "live", None), getattr(client, "world", None)
    return isinstance(live, int) and isinstance(world, int) and live < world


def _refuse(
    name: str, why: str = "DCP's ranks would exchange pickled objects, which phantom ranks do not carry"
) -> NotSimulatedError:
    return NotSimulatedError(
        f"torch.distributed.checkpoint.{name} in phantom mode: {why}; use dcp.save / dcp.load (supported in phantom "
        "mode), or run without --phantom"
    )


def _merged(parts: list[Any]) -> Any:
    """One checkpoint metadata of the ranks' own (`parts`): every tensor's chunks once, every item's storage."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    described: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    planner: dict[Any, Any] = {}
    for md in parts:
        for key, value in md.state_dict_metadata.items():
            have = described.get(key)
            if have is None:
                fresh = isinstance(value, TensorStorageMetadata)
                described[key] = dataclasses.replace(value, chunks=list(value.chunks)) if fresh else value
            elif isinstance(value, TensorStorageMetadata):
                known = {(tuple(c.offsets), tuple(c.sizes)) for c in have.chunks}
                have.chunks.extend(c for c in value.chunks if (tuple(c.offsets), tuple(c.sizes)) not in known)
        for index, info in (md.storage_data or {}).items():
            storage.setdefault(index, info)
        if isinstance(md.planner_data, dict):
            for key, value in md.planner_data.items():
                planner.setdefault(key, value)
    return dataclasses.replace(parts[0], state_dict_metadata=described, storage_data=storage, planner_data=planner)


def _write_global_metadata(path: str, world: int) -> None:
    """Merge the ranks' own metadata files in checkpoint folder `path` into the global `.metadata` a coordinated
    save writes (programs look for it: torchtitan finds its checkpoints so), and remove them."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.storage import WriteResult

    reader = FileSystemReader(path)
    ranks = [r for r in range(world) if os.path.exists(reader._get_metadata_path(r))]
    if not ranks:
        return
    merged = _merged([reader.read_metadata(rank=r) for r in ranks])
    results = [
        WriteResult(index=i, size_in_bytes=info.length, storage_data=info) for i, info in merged.storage_data.items()
    ]
    FileSystemWriter(path).finish(metadata=merged, results=[results])  # torch's own writing of `.metadata`
    for r in ranks:
        os.remove(reader._get_metadata_path(r))


def _on_instance(obj: Any, name: str, method: Callable[..., Any]) -> Callable[[], None]:
    """Set `obj.name` to `method` for one call of DCP; returns the undo (what the instance had, back)."""
    had = vars(obj).get(name, _MARK) if hasattr(obj, "__dict__") else _MARK
    setattr(obj, name, method)

    def undo() -> None:
        if had is _MARK:
            delattr(obj, name)
        else:
            setattr(obj, name, had)

    return undo


def _plan_exchanged(writer: Any, group: Any, coordinator: int) -> Callable[[], None]:
    """Make `writer.prepare_local_plan` also run a coordinated save's plan exchange with the real local plan
    (gathered to the coordinator, scattered back); returns the undo."""
    original = writer.prepare_local_plan

    def prepare_local_plan(plan: Any) -> Any:
        local = original(plan)
        world, me = dist.get_world_size(group), dist.get_rank(group)
        gathered: list[Any] | None = [None] * world if me == coordinator else None
        dist.gather_object(local, gathered, group=group, group_dst=coordinator)
        back: list[Any] = [None]
        dist.scatter_object_list(back, gathered, group=group, group_src=coordinator)
        return local

    return _on_instance(writer, "prepare_local_plan", prepare_local_plan)


def _written(writer: Any) -> tuple[list[Any], Callable[[], None]]:
    """Record the write results of `writer.write_data` (filled once its future is done); returns them and the undo."""
    original, results = writer.write_data, []

    def write_data(plan: Any, planner: Any) -> Any:
        future = original(plan, planner)
        future.then(lambda f: results.extend(f.value()))
        return future

    return results, _on_instance(writer, "write_data", write_data)


def _without_coordination(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_save_state_dict` saving each rank's part with its own metadata (use_collectives=False), with a coordinated
    save's exchanges of the real plan and write results; the coordinator then merges the ranks' metadata into the
    global metadata and broadcasts it (see the module doc)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        if not _distributed(bool(given["no_dist"])):
            return original(*args, **kwargs)
        given["use_collectives"] = False
        group, writer, coordinator = given["process_group"], given["storage_writer"], given["coordinator_rank"]
        if deduplicated():
            return _alone(original, given, group, writer, coordinator)
        undo_plan = _plan_exchanged(writer, group, coordinator)
        results, undo_written = _written(writer)
        try:
            out = original(**given)  # ends with a barrier: every rank's files are written
        finally:
            undo_plan()
            undo_written()
        me = dist.get_rank(group)
        gathered: list[Any] | None = [None] * dist.get_world_size(group) if me == coordinator else None
        dist.gather_object(results, gathered, group=group, group_dst=coordinator)
        if isinstance(writer, FileSystemWriter):
            if me == coordinator:
                _write_global_metadata(str(writer.path), dist.get_world_size(group))
            merged = [_global_metadata(str(writer.path)) if me == coordinator else None]
            dist.broadcast_object_list(merged, group=group, group_src=coordinator)
        return out

    setattr(call, _MARK, True)
    return call


def _alone(original: Callable[..., Any], given: dict[str, Any], group: Any, writer: Any, coordinator: int) -> Any:
    """A deduplicated run's save: each rank's part, no exchanges; the coordinator merges the metadata, a barrier."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    out = original(**given)  # ends with a barrier: every rank's files are written
    if isinstance(writer, FileSystemWriter):
        if dist.get_rank(group) == coordinator:
            _write_global_metadata(str(writer.path), dist.get_world_size(group))
        dist.barrier(group=group)
    return out


def _global_metadata(path: str) -> Any:
    """The global `.metadata` in checkpoint folder `path`, or None without one."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    reader = FileSystemReader(path)
    return reader.read_metadata() if os.path.exists(reader._get_metadata_path()) else None


def _refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _distributed(bool(kwargs.get("no_dist", False))):
            raise _refuse(name, "a save in the background is not modelled")
        return original(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


_load_groups: list[Any] = []  # the process group of each `_load_state_dict` in progress (innermost last)


def _loading_on_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_load_state_dict`, noting its process group while it runs (`_rank_in_load`)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        _load_groups.append(signature.bind(*args, **kwargs).arguments.get("process_group"))
        try:
            return original(*args, **kwargs)
        finally:
            _load_groups.pop()

    setattr(call, _MARK, True)
    return call


def _rank_in_load() -> int:
    """This rank's rank in the process group of the load in progress (the default group outside one): DCP names
    a rank's own metadata `__{rank}.metadata` by its rank in the group that saved, not its global rank."""
    return dist.get_rank(_load_groups[-1] if _load_groups else None)


def _own_metadata(original: Callable[..., Any]) -> Callable[..., Any]:
    """`FileSystemReader.read_metadata` falling back to the rank's own metadata (a checkpoint saved without rank
    coordination) before torch would, so that torch does not log the missing global file as a failure."""

    @functools.wraps(original)
    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is None and _distributed():
            me = _rank_in_load()
            path = self._get_metadata_path()
            own = self._get_metadata_path(me)
            if me >= 0 and not os.path.exists(path) and os.path.exists(own):
                kwargs["rank"] = me
        return original(self, *args, **kwargs)

    setattr(read_metadata, _MARK, True)
    return read_metadata


class _HostRecord(torch.Tensor):
    """A phantom tensor copied to the host, as DCP's writer takes it: on the CPU (so the writer's checks pass) yet
    without data (meta underneath), and pickled as torch pickles a meta tensor, a record of no bytes."""

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cpu")

    def __reduce_ex__(self, proto: Any) -> tuple[Any, tuple[Any, ...]]:  # type: ignore[override]
        args = (self.dtype, tuple(self.size()), self.stride(), self.requires_grad)
        return torch._utils._rebuild_meta_tensor_no_storage, args


def _host_records(original: Callable[..., Any]) -> Callable[..., Any]:
    """A save planner's `resolve_data` giving a phantom tensor as its host copy: the device-to-host copy is made
    (and charged) as DCP makes it, and handed over as a `_HostRecord`."""

    @functools.wraps(original)
    def resolve_data(self: Any, write_item: Any) -> Any:
        data = original(self, write_item)
        if isinstance(data, torch.Tensor) and not isinstance(data, _HostRecord):
            host = data.detach().cpu()
            if host.is_meta:
                return host.as_subclass(_HostRecord)
        return data

    setattr(resolve_data, _MARK, True)
    return resolve_data


def _local_wrapper(base: type) -> type:
    """DCP's `_DistWrapper`, whose plan exchanges run on the rank alone in a deduplicated run (`deduplicated`)."""

    class _LocalDistWrapper(base):  # type: ignore[valid-type,misc]
        def reduce_scatter(self, step: str, map_fun: Callable[[], Any], reduce_fun: Callable[[list[Any]], Any]) -> Any:
            if not self.use_dist or not deduplicated():
                return super().reduce_scatter(step, map_fun, reduce_fun)
            return reduce_fun([map_fun()])[0]

        def all_gather(self, step: str, map_fun: Callable[[], Any]) -> list[Any]:
            if not self.use_dist or not deduplicated():
                return super().all_gather(step, map_fun)  # type: ignore[no-any-return]
            return [map_fun()]

        def all_reduce(self, step: str, map_fun: Callable[[], Any], reduce_fun: Callable[[list[Any]], Any]) -> Any:
            if not self.use_dist or not deduplicated():
                return super().all_reduce(step, map_fun, reduce_fun)
            raise _refuse(f"all_reduce (step {step!r}) with rank deduplication", "mirrored ranks plan with no process")

        def broadcast(self, step: str, map_fun: Callable[[], Any]) -> Any:
            if not self.use_dist or not deduplicated():
                return super().broadcast(step, map_fun)
            raise _refuse(f"broadcast (step {step!r}) with rank deduplication", "mirrored ranks plan with no process")

    _LocalDistWrapper.__name__ = "_LocalDistWrapper"
    setattr(_LocalDistWrapper, _MARK, True)
    return _LocalDistWrapper


def _patch(package: ModuleType) -> None:
    from torch.distributed.checkpoint import default_planner, filesystem, state_dict_loader, state_dict_saver

    if getattr(state_dict_saver._save_state_dict, _MARK, False):
        return
    state_dict_saver._save_state_dict = _without_coordination(state_dict_saver._save_state_dict)
    state_dict_loader._DistWrapper = _local_wrapper(state_dict_loader._DistWrapper)  # type: ignore[misc,assignment]
    state_dict_loader._load_state_dict = _loading_on_group(state_dict_loader._load_state_dict)
    planner = default_planner.DefaultSavePlanner
    planner.resolve_data = _host_records(planner.resolve_data)  # type: ignore[method-assign]
    filesystem.FileSystemReader.read_metadata = _own_metadata(filesystem.FileSystemReader.read_metadata)  # type: ignore[method-assign]
    for owner in (package, state_dict_saver):
        original = getattr(owner, "async_save", None)
        if original is not None and not getattr(original, _MARK, False):
            owner.async_save = _refusing("async_save", original)  # type: ignore[attr-defined]


def enable() -> None:
    """Make `torch.distributed.checkpoint` save and load in multi-rank phantom runs (once imported)."""
    import_hooks.after_import("torch.distributed.checkpoint", _patch)
