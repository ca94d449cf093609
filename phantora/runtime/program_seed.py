"""The program seed: a live run's process-global generators seeded before the program runs (`--program-seed`).

An unseeded program draws from generators a fresh interpreter seeds at random (torch's CPU default generator, Python's
`random`, numpy's legacy global generator) and iterates sets and dicts of strings in an order `hash` randomises per
interpreter; so two runs of it drew different numbers and, where the numbers steer the program
(`nn.init.trunc_normal_` redraws out-of-range values), ran different ops. A run seeds them from the run's program
seed S and the process's stream ("rank R", ...), before the program's first line, and starts the rank interpreters
with PYTHONHASHSEED=S: the same inputs and S give the same run. A program that seeds a generator itself
(torch.manual_seed, random.seed, np.random.seed) replaces that seed, as on a real cluster. The simulated CUDA
generators are not touched (they start at PyTorch's default CUDA seed, simcuda/rng.py). `random` keeps every
generator as the interpreter seeds it: runs differ, as unseeded processes do.

Torch-free at import. The option's value and its check are phantora.rank_options' (`parse_program_seed`).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Mapping

from phantora.rank_options import (
    DEFAULT_PROGRAM_SEED,
    MAX_PROGRAM_SEED,
    PROGRAM_SEED_ENV,
    RANDOM_SEED,
    parse_program_seed,
)


def stream_seed(seed: int, stream: str) -> int:
    """The 64-bit seed of `stream` ("rank 3") under the run's program seed: distinct streams, fixed by both."""
    digest = hashlib.sha256(f"phantora program seed {seed}: {stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _value(stream: str, env: Mapping[str, str] | None) -> int | None:
    """`stream`'s seed under the program seed in `env` (default os.environ; absent: DEFAULT_PROGRAM_SEED), None
    under "random"."""
    env = os.environ if env is None else env
    seed = parse_program_seed(env.get(PROGRAM_SEED_ENV, str(DEFAULT_PROGRAM_SEED)))
    return None if seed == RANDOM_SEED else stream_seed(int(seed), stream)


def seed_process(stream: str, env: Mapping[str, str] | None = None) -> int | None:
    """Seed this process's torch CPU default generator, `random` and numpy's legacy global generator for `stream`;
    return the seed (`_value`). torch.default_generator only: torch.manual_seed would also reseed the CUDA
    generators."""
    value = _value(stream, env)
    if value is None:
        return None
    random.seed(value)
    import torch

    torch.default_generator.manual_seed(value)
    try:
        import numpy as np
    except ImportError:
        return value
    np.random.seed(value & MAX_PROGRAM_SEED)
    return value


def seed_forked(stream: str, env: Mapping[str, str] | None = None) -> int | None:
    """In a process forked from the program (a rank of mp.spawn's fork method): seed `random` only, which Python
    reseeds at random in every forked child; torch's and numpy's generators stay the parent's, as they do under fork."""
    value = _value(stream, env)
    if value is not None:
        random.seed(value)
    return value
