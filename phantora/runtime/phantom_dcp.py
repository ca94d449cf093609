"""torch.distributed.checkpoint (DCP) in phantom mode: refused in one line, before any rank waits on another.

DCP's ranks agree on what each writes by gathering and scattering pickled plans (`gather_object`,
`broadcast_object_list`). Phantom ranks exchange no data (their collectives are timed, not carried), so the
plans would arrive empty and DCP would stop on an unpickling error deep inside torch. `torch.save` works in
phantom mode (phantom tensors are saved as meta records: simcuda/checkpoint.py), and DCP works in real mode.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch.distributed as dist

from phantora.runtime import import_hooks
from phantora.runtime.simcuda.devices import NotSimulatedError

_ENTRY_POINTS = ("save", "async_save", "load", "save_state_dict", "load_state_dict")


def _refusing(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if dist.is_initialized() and dist.get_world_size() > 1 and not kwargs.get("no_dist", False):
            raise NotSimulatedError(
                f"torch.distributed.checkpoint.{name} in phantom mode: DCP's ranks exchange their plans as pickled "
                "objects, which phantom ranks do not carry; run without --phantom (real mode), or save with "
                "torch.save (phantom tensors are saved without data, as meta tensors)"
            )
        return original(*args, **kwargs)

    call._phantora = True  # type: ignore[attr-defined]
    return call


def _patch(package: ModuleType) -> None:
    for name in _ENTRY_POINTS:
        original = getattr(package, name, None)
        if original is not None and not getattr(original, "_phantora", False):
            setattr(package, name, _refusing(name, original))


def refuse_in_phantom_mode() -> None:
    """Make `torch.distributed.checkpoint`'s save and load refuse multi-rank phantom runs (once imported)."""
    import_hooks.after_import("torch.distributed.checkpoint", _patch)
