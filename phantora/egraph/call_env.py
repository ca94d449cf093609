"""The NCCL settings a replayed call runs under: the recording's, with what the replaying user sets on top.

A live run fixes the NCCL_* variables of its environment when it starts (the recording keeps them as
`meta.algo.nccl_env`), and a process group created after the program set its own (`os.environ["NCCL_ALGO"] = ...`)
runs its calls under those (`runtime/program_env.py`; the recording keeps them per call, `Coll/P2P.nccl_env`). A
replay runs each call under the same variables, except each one the replaying process sets in its environment, which
replaces that variable for every call (set it empty to drop it). One thing cannot be replayed differently: lone
sends recorded with buffer registration on (PHANTORA_NCCL_REGISTER) moved zero-copy, so the recording holds no
hand-off for them, which a replay with registration off would need: it is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from phantora.collectives.nccl.register_env import register_of
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.spec import AlgoOptions
from phantora.egraph.format import P2P, ExecGraph, NcclEnv
from phantora.errors import InputError

REGISTER = "PHANTORA_NCCL_REGISTER"


def over(base: NcclEnv, own: Mapping[str, str]) -> NcclEnv:
    """`base` with every variable `own` sets replacing its value (an empty value drops it)."""
    merged = {**dict(base), **own}
    return nccl_env({k: v for k, v in merged.items() if v != ""})


def recorded_env(graph: ExecGraph) -> NcclEnv | None:
    """The NCCL_* variables the recorded run started with (meta.algo.nccl_env); None if it did not say."""
    env = (graph.meta.get("algo") or {}).get("nccl_env")
    if env is None:
        return None
    if not isinstance(env, list | tuple) or not all(isinstance(kv, list | tuple) and len(kv) == 2 for kv in env):
        raise InputError(f"bad recorded NCCL variables {env!r:.80}", field="meta.algo.nccl_env")
    return tuple((str(k), str(v)) for k, v in env)


class CallOptions:
    """The AlgoOptions of each replayed call: the run's `algo`, or for a call with its own NCCL_* variables those,
    under the replaying process's own variables `own` (default: its environment's)."""

    def __init__(self, algo: AlgoOptions, own: Mapping[str, str] | None = None) -> None:
        self.algo = algo
        self.own = dict(nccl_env() if own is None else nccl_env(own))
        self._cache: dict[NcclEnv, AlgoOptions] = {}

    def of(self, env: NcclEnv | None) -> AlgoOptions:
        if env is None:
            return self.algo
        got = self._cache.get(env)
        if got is None:
            got = self._cache[env] = dataclasses.replace(self.algo, nccl_env=over(env, self.own))
        return got

    def check_registration(self, graph: ExecGraph) -> None:
        """Refuse a replay that turns off the buffer registration lone sends were recorded with."""
        run = recorded_env(graph)
        for prog in graph.programs:
            for n in prog.nodes:
                if not (isinstance(n, P2P) and n.is_send and n.tag >= 0):
                    continue
                then = n.nccl_env if n.nccl_env is not None else run
                if then is None or register_of(dict(then)) == 0:
                    continue
                now = self.of(n.nccl_env).nccl_env
                if register_of(dict(now) if now is not None else dict(nccl_env())) == 0:
                    raise InputError(
                        f"the recording's sends ran with {REGISTER}={dict(then)[REGISTER]} (zero-copy, recorded "
                        "without hand-offs), which this replay turns off; replay with it, or record without it",
                        field=REGISTER,
                    )
