"""The model switches a run reads from its environment: recorded in config.json (`model_env`), restored by rerun.

A `phantora run`'s options are recorded as given, but some of the model is switched by environment variables the
ranks read for themselves (the host compute model, NCCL's host launch, the modelled NCCL and torch releases, the
memory tracker, ...). `recorded` writes down every one of them, set or not (`null`: unset, so its default applied),
with the NCCL_* variables the NCCL model reads and OMP_NUM_THREADS (the host model's thread count); `restored`
gives a rerun exactly that environment: the recorded values set, the ones the run did not have unset.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from phantora.errors import InputError

# Every PHANTORA_* variable a rank or the launcher reads from the user's environment that changes simulated results.
MODEL_SWITCHES = (
    "PHANTORA_HOST_COMPUTE",  # runtime/hostwork.py: host ops and PCIe copies (off by default)
    "PHANTORA_HOST",  # perfmodel/hosts.py: the target host
    "PHANTORA_HOST_THREADS",  # runtime/hostwork.py: the host ops' modelled threads
    "PHANTORA_NCCL_HOST_LAUNCH",  # runtime/nccl_launch.py: NCCL calls' host launch (on by default)
    "PHANTORA_NCCL_VERSION",  # collectives/nccl: the modelled NCCL release
    "PHANTORA_NCCL_REGISTER",  # egraph/call_env.py: NCCL buffer registration
    "PHANTORA_TORCH_VERSION",  # runtime/simcuda/torch_release.py: the modelled torch release
    "PHANTORA_COMPILE_FUSION",  # torch.compile's fusion model
    "PHANTORA_PHANTOM_SHAPES",  # runtime/data_shapes.py: phantom mode's sizes of data-dependent ops
    "PHANTORA_MEMORY",  # runtime/memory.py: device memory tracking
    "PHANTORA_MEMORY_LIMIT",
    "PHANTORA_MEMORY_RESERVE",
    "PHANTORA_GLOO_COST",  # runtime/gloo_cost.py: gloo's cost model
    "PHANTORA_STORAGE_GBPS",  # runtime/storage.py: checkpoint storage
    "PHANTORA_SHARED_FS_GBPS",
)
OTHER = ("OMP_NUM_THREADS",)  # torch's intra-op threads: the host model's thread count
PREFIXES = ("NCCL_",)  # NCCL's own variables, read by the NCCL model (collectives/nccl/settings.py)


def _ours(name: str) -> bool:
    return name in MODEL_SWITCHES or name in OTHER or name.startswith(PREFIXES)


def recorded(env: Mapping[str, str]) -> dict[str, str | None]:
    """config.json's `model_env`: every model switch and OMP_NUM_THREADS by name, its value or None if unset, and
    every NCCL_* variable set in `env`."""
    doc: dict[str, str | None] = {name: env.get(name) for name in (*MODEL_SWITCHES, *OTHER)}
    doc.update({k: v for k, v in sorted(env.items()) if k.startswith(PREFIXES)})
    return doc


def check(doc: Any, where: str) -> dict[str, str | None]:
    """A recorded `model_env`, checked: names of switches, values strings or null (InputError naming the field)."""
    if not isinstance(doc, dict):
        raise InputError("expected an object of variable names", file=where, field="model_env")
    for k, v in doc.items():
        if not _ours(k) or not (v is None or isinstance(v, str)):
            raise InputError(f"{k!r}: not a model switch with a string or null value", file=where, field="model_env")
    return dict(doc)


@contextlib.contextmanager
def restored(doc: Mapping[str, str | None], environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """`environ` (default os.environ) as the recorded run had it, for the duration: each recorded switch set to its
    value or unset, every NCCL_* the run did not have unset; restored afterwards."""
    env = os.environ if environ is None else environ
    names = {*doc, *(k for k in env if k.startswith(PREFIXES))}
    saved = {k: env.get(k) for k in names}
    try:
        for k in names:
            value = doc.get(k)
            if value is None:
                env.pop(k, None)
            else:
                env[k] = value
        yield
    finally:
        for k, value in saved.items():
            if value is None:
                env.pop(k, None)
            else:
                env[k] = value
