"""The simulated GPUs' random number generators: counter-based, as CUDA's Philox generator is.

A CUDA generator's state is 16 bytes, a 64-bit seed then a 64-bit offset, and a draw depends only on
the two: the offset moves on by the number of values drawn. Programs rely on that. DTensor's RNG
tracker sets the offset of each shard before a draw, so that ranks draw disjoint parts of one stream;
activation checkpointing saves the state and sets it again to replay the same dropout masks.

Each simulated device keeps such a (seed, offset) pair. A random op on its tensors (an aten op tagged
``nondeterministic_seeded``) draws with the CPU generator seeded from the pair, inside a fork of the
CPU generator so that host randomness is not disturbed, and then moves the offset on by the values
drawn, rounded up to four (one Philox call gives four). The values are not those a GPU would give,
but they are a function of (seed, offset) alone, as on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_MASK = (1 << 64) - 1
DEFAULT_SEED = 67280421310721  # PyTorch's default seed, for CPU and CUDA generators alike

_state: dict[int, tuple[int, int]] = {}


def manual_seed(index: int, seed: int) -> None:
    """Seed device `index`'s generator; its offset restarts at 0."""
    _state[index] = (int(seed) & _MASK, 0)


def get_state(index: int) -> tuple[int, int]:
    """(seed, offset) of device `index`."""
    return _state.get(index, (DEFAULT_SEED, 0))


def set_state(index: int, seed: int, offset: int) -> None:
    _state[index] = (int(seed) & _MASK, int(offset) & _MASK)


def _mix(seed: int, offset: int) -> int:
    """A 63-bit seed for the CPU generator from (seed, offset) (splitmix64 of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + offset + 0x632BE59BD9B4E019) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


_RANDOM: dict[Any, bool] = {}  # by op: asked for every op the simulated GPU runs, so answered once per op


def is_random(func: Any) -> bool:
    """Does this aten op draw random numbers?"""
    known = _RANDOM.get(func)
    if known is None:
        known = _RANDOM[func] = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return known


def _numel(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, list | tuple):
        return max((_numel(x) for x in out), default=0)
    return 0


def draw(index: int, values: bool, run: Callable[[], Any]) -> Any:
    """Run the random op `run` on device `index`'s generator; `values`: whether it computes values (real
    mode) or only shapes (phantom mode), which draw nothing but still move the offset on."""
    seed, offset = get_state(index)
    if values:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(_mix(seed, offset))
            out = run()
    else:
        out = run()
    drawn = _numel(out)
    set_state(index, seed, offset + ((drawn + 3) // 4) * 4)
    return out
