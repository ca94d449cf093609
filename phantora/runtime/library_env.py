"""Library switches a rank sets before the program starts, so that a library's default does not put the program's
GPU work on a thread of its own, which phantora does not simulate ("GPU work on another thread", docs/runtime.md).

transformers 5 loads a checkpoint's weights on a pool of worker threads (`core_model_loading.py`, up to 4), and
with `from_pretrained(..., device_map="cuda")` or a tensor-parallel plan each worker copies its weights to the GPU
there. `HF_DEACTIVATE_ASYNC_LOAD=1`, transformers' own switch, loads them one after another on the program's
thread: the same weights, in the same order of keys. A variable the environment sets already is left as it is.
"""

from __future__ import annotations

import os

# name -> value: each one the library's own documented switch to keep its work on the calling thread
DEFAULTS: dict[str, str] = {"HF_DEACTIVATE_ASYNC_LOAD": "1"}


def set_defaults(environ: dict[str, str] | None = None) -> None:
    """Set each of `DEFAULTS` in `environ` (the process's environment) that is not set already."""
    env = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)
