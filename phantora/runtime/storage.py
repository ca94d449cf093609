"""Checkpoint storage time: what writing and reading a checkpoint costs a rank in simulated time.

A checkpoint stalls training while the host writes it. With a storage model set (`phantora run --storage GBPS
[--shared-fs GBPS]`, i.e. PHANTORA_STORAGE_GBPS and PHANTORA_SHARED_FS_GBPS), each checkpoint file a rank writes
or reads stalls its clock on the compute lane (the GPU waits: nothing is issued while the host writes), shown as
a span on the rank's "storage" lane of trace.json and counted per step in steps.jsonl (`storage_ns`,
`storage_bytes`) and in the rank's results (`storage`).

The storage is a resource the ranks share in simulated time (bridge.storage_engine, run by the coordinator beside
the network): each host has a link of `--storage` GB/s (its NVMe, or its path to the file servers) and the job
optionally a shared filesystem of `--shared-fs` GB/s aggregate; the files in flight share them max-min fairly,
re-shared as each starts and ends. A lone file of B bytes takes B / min(host, shared): a program in which only
rank 0 writes (torch.save of a DDP model) gets the whole link, and a sharded checkpoint (DCP, FSDP, ZeRO) that
every rank writes at once shares it. Without the bridge (a session with no network) a file has the storage
alone. Latency per file, page cache, other jobs' I/O and asynchronous checkpointing are not modelled.

What is counted: `torch.save` and `torch.load` to or from a file (a path or an open file; not an in-memory
buffer), `safetensors.torch.save_file` / `load_file` (HF Trainer's and torchtitan's model files), and the data
files of `torch.distributed.checkpoint`'s `FileSystemWriter.write_data` / `FileSystemReader.read_data` (the bytes
DCP reports; the torch.save calls DCP makes inside are not counted twice).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import io
import math
import os
from dataclasses import dataclass
from typing import Any

GBPS_ENV, SHARED_ENV = "PHANTORA_STORAGE_GBPS", "PHANTORA_SHARED_FS_GBPS"


@dataclass(frozen=True)
class StorageModel:
    """Bandwidths in bytes per second: a host's link, and the shared filesystem's (None: none)."""

    host_bps: float
    shared_bps: float | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StorageModel | None:
        e = dict(os.environ if env is None else env)
        if not e.get(GBPS_ENV):
            return None
        host = _gbps(e, GBPS_ENV)
        return cls(host, _gbps(e, SHARED_ENV) if e.get(SHARED_ENV) else None)

    def lone_bps(self) -> float:
        """The rate of a file with the storage to itself: min(host, shared)."""
        return self.host_bps if self.shared_bps is None else min(self.host_bps, self.shared_bps)

    def lone_ns(self, nbytes: int) -> int:
        return round(nbytes / self.lone_bps() * 1e9)


def _gbps(env: dict[str, str], name: str) -> float:
    """The bandwidth `env[name]` gives in GB/s, in bytes/s; a clear error for a bad one."""
    try:
        value = float(env[name])
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name}={env[name]!r}: a storage bandwidth is a positive number of GB/s")
    return value * 1e9


_depth = 0  # > 0 inside a counted call: the calls it makes (DCP's torch.save of each tensor) are not counted


def _charge(kind: str, name: str, nbytes: int) -> None:
    from phantora.runtime import session

    s = session.current()
    model = _model
    if s is None or model is None or nbytes <= 0:
        return
    s.storage_io(f"{kind} {name}", kind, nbytes, model)


def _file_size(f: Any) -> int | None:
    """The size of the file `f` names or is (a path, or an open file with a descriptor); None for a buffer."""
    try:
        if isinstance(f, (str, bytes, os.PathLike)):
            return os.path.getsize(f)
        if isinstance(f, io.BytesIO) or not hasattr(f, "fileno"):
            return None
        return os.fstat(f.fileno()).st_size
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


def _phantom_bytes(obj: Any, depth: int = 0) -> int:
    """The bytes phantom tensors in `obj` (dicts, lists, tuples of them) would hold: phantom mode saves them as
    records without data, and a real checkpoint of the model holds that data."""
    from phantora.runtime import session

    s = session.current()
    if s is None or not s.phantom or depth > 8:
        return 0
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() if _is_phantom(obj) else 0
    if isinstance(obj, dict):
        return sum(_phantom_bytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_phantom_bytes(v, depth + 1) for v in obj)
    return 0


def _is_phantom(t: Any) -> bool:
    inner = getattr(t, "elem", t)
    return bool(getattr(inner, "is_meta", False))


def _name(f: Any) -> str:
    return (
        os.path.basename(os.fsdecode(f)) if isinstance(f, (str, bytes, os.PathLike)) else str(getattr(f, "name", "?"))
    )


def _counted(kind: str, original: Any, file_arg: int) -> Any:
    """`original` (a save or load function whose argument `file_arg` is the file, after the saved object for a
    save) charging the file's bytes."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _depth
        if _depth:
            return original(*args, **kwargs)
        f = args[file_arg] if len(args) > file_arg else kwargs.get("f", kwargs.get("filename"))
        saved = args[0] if args else kwargs.get("obj", kwargs.get("tensors"))  # torch.save / save_file by name
        before = _file_size(f) if kind == "write" and not isinstance(f, (str, bytes, os.PathLike)) else 0
        _depth += 1
        try:
            out = original(*args, **kwargs)
        finally:
            _depth -= 1
        size = _file_size(f)
        if size is not None:
            _charge(kind, _name(f), size - (before or 0) + _phantom_bytes(saved if kind == "write" else out))
        return out

    call._phantora_storage = True  # type: ignore[attr-defined]
    return call


def _phantom_session() -> bool:
    from phantora.runtime import session

    s = session.current()
    return s is not None and bool(s.phantom)


def _chunk_bytes(sizes: Any, dtype: Any) -> int:
    import torch

    return math.prod(sizes) * torch._utils._element_size(dtype)


def _holders(planner: Any, item: Any) -> int:
    """How many ranks hold a DCP write item that real DCP writes once: every rank for a plain tensor (SPMD), the
    ranks a DTensor's shard is replicated over (its mesh dimensions that do not shard it), else 1."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.planner import WriteItemType

    if item.type == WriteItemType.TENSOR:
        return dist.get_world_size() if dist.is_initialized() else 1
    obj: Any = (getattr(planner, "state_dict", None) or {}).get(item.index.fqn)
    placements = getattr(obj, "placements", None)
    if placements is None:
        return 1
    mesh = obj.device_mesh
    return math.prod(mesh.size(d) for d, p in enumerate(placements) if not p.is_shard())


def _dcp_written(plan: Any, planner: Any, results: Any) -> int:
    """The bytes of a rank's DCP data files: the lengths DCP reports; in phantom mode (meta records in the files,
    every replicated item written by every rank: phantom_dcp.py) the bytes a real checkpoint's tensors hold, a
    replicated item's over the ranks holding it (real DCP writes it once), and the objects' lengths as written."""
    if not _phantom_session():
        return sum(r.storage_data.length for r in results)
    written = {r.index: r.storage_data.length for r in results}
    total = 0.0
    for item in plan.items:
        if item.tensor_data is None:
            total += written.get(item.index, 0)
        else:
            chunk = _chunk_bytes(item.tensor_data.chunk.sizes, item.tensor_data.properties.dtype)
            total += chunk / _holders(planner, item)
    return round(total)


def _dcp_read_bytes(reader: Any, plan: Any, planner: Any) -> int:
    """The bytes a rank's DCP load reads: the stored lengths of its items; in phantom mode a tensor item's
    would-be bytes (the file holds a meta record), from the checkpoint metadata's dtype."""
    data = getattr(reader, "storage_data", {}) or {}
    phantom = _phantom_session()
    described = getattr(getattr(planner, "metadata", None), "state_dict_metadata", {}) or {}
    total = 0
    for i in plan.items:
        dtype = getattr(getattr(described.get(i.storage_index.fqn), "properties", None), "dtype", None)
        if phantom and dtype is not None:
            total += _chunk_bytes(i.lengths, dtype)
        elif i.storage_index in data:
            total += data[i.storage_index].length
    return total


def _dcp_write(original: Any) -> Any:
    @functools.wraps(original)
    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        global _depth
        _depth += 1
        try:
            fut = original(self, plan, planner)
            results = fut.wait()
        finally:
            _depth -= 1
        _charge("write", f"dcp {os.path.basename(str(self.path))}", _dcp_written(plan, planner, results))
        return fut

    write_data._phantora_storage = True  # type: ignore[attr-defined]
    return write_data


def _dcp_read(original: Any) -> Any:
    @functools.wraps(original)
    def read_data(self: Any, plan: Any, planner: Any) -> Any:
        global _depth
        _depth += 1
        try:
            fut = original(self, plan, planner)
        finally:
            _depth -= 1
        _charge("read", f"dcp {os.path.basename(str(self.path))}", _dcp_read_bytes(self, plan, planner))
        return fut

    read_data._phantora_storage = True  # type: ignore[attr-defined]
    return read_data


_model: StorageModel | None = None
_originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) of each function install replaced


def _replace(owner: Any, attr: str, wrapper: Any) -> None:
    original = getattr(owner, attr)
    if getattr(original, "_phantora_storage", False):
        return
    _originals.append((owner, attr, original))
    setattr(owner, attr, wrapper(original))


def install(model: StorageModel | None = None) -> StorageModel | None:
    """Charge checkpoint I/O by `model` (default: from the environment); nothing when there is none."""
    global _model
    _model = model if model is not None else StorageModel.from_env()
    if _model is None:
        return None
    import torch

    _replace(torch, "save", lambda f: _counted("write", f, 1))
    _replace(torch, "load", lambda f: _counted("read", f, 0))
    if importlib.util.find_spec("safetensors") is not None:  # HF's model files
        safetensors_torch = importlib.import_module("safetensors.torch")
        _replace(safetensors_torch, "save_file", lambda f: _counted("write", f, 1))
        _replace(safetensors_torch, "load_file", lambda f: _counted("read", f, 0))
    from torch.distributed.checkpoint import filesystem as fs

    _replace(fs.FileSystemWriter, "write_data", _dcp_write)
    _replace(fs.FileSystemReader, "read_data", _dcp_read)
    return _model


def uninstall() -> None:
    """Put back what `install` replaced (tests)."""
    global _model
    while _originals:
        owner, attr, original = _originals.pop()
        setattr(owner, attr, original)
    _model = None
