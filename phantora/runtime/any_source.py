"""A rank's receives from any source (gloo's `recvAnysource`): issued with their candidates, given a send later.

The coordinator decides which send each one takes (bridge/anysource.py) and says so in a `source` message before the
receive's result, while the rank is blocked; `AnyRecvs.told` then numbers the pair's later receives after it and, in
real mode, posts gloo's receive from that rank (gloo moves the data from the sender the simulation chose, not from
whichever arrives first), so the sender's wait for its gloo send ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from phantora.collectives.flow_tags import call_name
from phantora.collectives.spec import HOST_ALGO
from phantora.runtime.program_env import NcclEnv
from phantora.runtime.simcuda.devices import NotSimulatedError

Pending = Any  # runtime/session.py's (which imports this module): a call in flight
RankSession = Any

# src -> (the gloo works moving its data, the receive's finish once done), made once the send is known
OnSource = Callable[[int], tuple[list[Any], Callable[[], None] | None]]


@dataclass
class _Open:
    pending: Pending
    tag: int
    pgs: dict[int, int]  # candidate global rank -> the pg of the process group it shares with this rank there
    on_source: OnSource


class AnyRecvs:
    """One rank's receives from any source: those not yet told their send, and the source of each one told."""

    def __init__(self, session: RankSession) -> None:
        self._s = session
        self._open: dict[int, _Open] = {}  # bridge handle -> the receive
        self._sources: dict[int, int] = {}  # Pending id -> the global rank it received from
        self._count = 0

    def issue(
        self,
        *,
        peers: Sequence[tuple[int, int]],
        tag: int,
        nbytes: int,
        tensors: Iterable[torch.Tensor],
        on_source: OnSource,
        nccl_env: NcclEnv | None = None,
        host: bool = False,
    ) -> Pending:
        """A receive from any of `peers` ((global rank, pg) pairs), in flight; on no NCCL stream (gloo's). `host`: on a
        gloo_sync group, whose sends are outside the NCCL model (`HOST_ALGO`, as `RankSession.issue_p2p`'s)."""
        s = self._s
        if s.listeners:
            raise NotSimulatedError(
                "a recv from any source in a recorded run (--record): an execution graph names each recv's peer"
            )
        client: Any = s.client
        p2p_any = getattr(client, "p2p_any", None)
        if p2p_any is None:
            raise NotSimulatedError("a recv from any source without a coordinator: name the source rank")
        client.on_source = self.told
        t = s.issue_at()
        label = call_name("recv_any", self._count, tag)
        self._count += 1
        algo: dict[str, Any] | None = {"nccl_env": [list(kv) for kv in nccl_env]} if nccl_env is not None else None
        if host:
            algo = dict(HOST_ALGO)
        h = p2p_any(peers=list(peers), tag=tag, nbytes=nbytes, t_issue_ns=t, name=label, algo=algo)
        p = s._register("recv", label, nbytes, t, [h], list, tensors, None, tuple(r for r, _ in peers))
        self._open[h] = _Open(p, tag, dict(peers), on_source)
        return p

    def told(self, handle: int, src: int, seq: int) -> None:
        """The coordinator gave receive `handle` the send number `seq` from `src`: the pair's next receive is `seq` +
        1, and the data starts moving (real mode)."""
        o = self._open.pop(handle, None)
        if o is None:
            return
        key = (src, o.tag, False, o.pgs[src])
        self._s._p2p_seq[key] = max(self._s._p2p_seq.get(key, 0), seq + 1)
        self._sources[o.pending.id] = src
        with self._s.internal():
            inner, finalize = o.on_source(src)
        o.pending.inner.extend(inner)
        o.pending.finalize = finalize

    def source(self, p: Pending) -> int | None:
        """The global rank `p` received from, once told."""
        return self._sources.get(p.id)

    def check_named(self, peer: int, tag: int, pg: int) -> None:
        """A receive naming `peer` while one from any source with its tag may still take `peer`'s send: refused (which
        of the two takes which send would depend on the order the coordinator learned them)."""
        for o in self._open.values():
            if o.tag == tag and o.pgs.get(peer) == pg:
                raise NotSimulatedError(
                    f"a recv from rank {peer} (tag {tag}) while a recv from any source with that tag is not yet "
                    f"matched ({o.pending.name}): wait for that one first"
                )
