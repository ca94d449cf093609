"""Rendezvous of collective and point-to-point calls, with mismatch diagnostics.

A collective is identified by (group, seq, pg): the global ranks in group order, the sequence number on its
process group, and which of the process groups over those ranks it runs on (`pg`: 0 for the first one a rank
created, 1 for the next, ...; all members number them alike, since they create them together). In NCCL two such
groups are two communicators, each with its own order, so their calls never meet. A transfer is identified by
(src, dst, tag, seq, pg), `pg` numbering the process groups that hold both ends, and both its send and its recv
must arrive. The first call of an identity fixes what the others must agree on (kind, size,
dtype, root, algorithm options, reduction); any disagreement is a `RunFailed` naming ranks and calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.errors import RunFailed
from bridge.protocol import E_MISMATCH, E_PROTOCOL

if TYPE_CHECKING:
    from phantora.collectives.mirrors import Mirrors


@dataclass(frozen=True)
class Call:
    """One rank's side of a collective or transfer."""

    rank: int
    handle: int
    kind: str  # collective kind, or "send"/"recv"
    nbytes: int
    dtype: str
    root: int | None  # global rank
    t: int
    name: str = ""
    algo: tuple[tuple[str, Any], ...] = ()
    comm: tuple[int, ...] = ()  # a grouped send/recv's communicator (global ranks); () for a lone one
    redop: str = "sum"  # the reduction of an all-reduce, reduce-scatter or reduce (Collective.redop)

    def describe(self) -> str:
        extra = f", root={self.root}" if self.root is not None else ""
        extra += f", op={self.redop}" if self.redop != "sum" else ""
        extra += f", algo={dict(self.algo)}" if self.algo else ""
        label = f" '{self.name}'" if self.name else ""
        typed = "" if self.kind in ("send", "recv") else f", {self.dtype}"  # a transfer's wire carries bytes alone
        return f"rank {self.rank} called {self.kind}{label}({self.nbytes} B{typed}{extra}) at {self.t} ns"

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.nbytes, self.dtype, self.root, self.algo, self.redop)


def ranks_list(ranks: Iterable[int]) -> str:
    """Ranks as a list; more than 16 cut to the first 8, the last and how many, so a line stays short."""
    rs = list(ranks)
    if len(rs) <= 16:
        return str(rs)
    return "[" + ", ".join(map(str, rs[:8])) + f", ..., {rs[-1]}] ({len(rs)} ranks)"


def describe_key(key: tuple[Any, ...]) -> str:
    """A rendezvous key as text: ("coll", group, seq, pg) or ("p2p", src, dst, tag, seq, pg)."""
    pg = key[3] if key[0] == "coll" and len(key) > 3 else key[5] if len(key) > 5 else 0
    on = f" (its process group {pg} over them)" if pg else ""
    if key[0] == "coll":
        return f"group {ranks_list(key[1])}{on} seq {key[2]}"
    src, dst, tag, seq = key[1:5]
    return f"transfer {src} -> {dst}{on} tag {tag} seq {seq}"


@dataclass
class Rendezvous:
    """Calls gathered so far for one identity."""

    key: tuple[Any, ...]
    members: tuple[int, ...]  # ranks that must call
    calls: dict[int, Call] = field(default_factory=dict)

    @property
    def missing(self) -> list[int]:
        return [r for r in self.members if r not in self.calls]

    def describe(self) -> str:
        first = next(iter(self.calls.values()))
        kind = "send/recv" if self.key[0] == "p2p" else first.kind
        missing = self.missing
        who = (
            f"issued by ranks {ranks_list(sorted(self.calls))}, missing {ranks_list(missing)}"
            if missing
            else f"issued by all {len(self.members)} ranks"
        )
        return f"{kind} on {describe_key(self.key)} ({first.nbytes} B): {who}"


class Matcher:
    """Pending rendezvous; `add` returns the complete one when its last call arrives."""

    def __init__(self, world: int, mirrors: Mirrors | None = None) -> None:
        self.world = world
        self.mirrors = mirrors if mirrors is not None and mirrors.active else None
        self.pending: dict[tuple[Any, ...], Rendezvous] = {}
        self.done_keys: set[tuple[Any, ...]] = set()

    def _check_ranks(self, call: Call, ranks: tuple[int, ...], what: str) -> None:
        bad = [r for r in ranks if not 0 <= r < self.world]
        if bad:
            raise RunFailed(E_PROTOCOL, f"{call.describe()}: {what} names rank {bad[0]}, outside 0..{self.world - 1}")

    def collective(self, call: Call, group: tuple[int, ...], seq: int, pg: int = 0) -> Rendezvous | None:
        """Add a collective call on process group `pg` over `group`; the Rendezvous once every member has called."""
        self._check_ranks(call, group, "the group")
        if len(set(group)) != len(group):
            raise RunFailed(E_PROTOCOL, f"{call.describe()}: the group {list(group)} repeats a rank")
        if call.rank not in group:
            raise RunFailed(E_PROTOCOL, f"{call.describe()} on group {list(group)}, which does not contain it")
        m = self.mirrors
        if m is not None:  # live ranks issue on shifts of one group: they meet under its canonical shift
            canon = m.canonical(group)[0]  # the caller already carried its root there (canonical_root)
            if call.root is not None and call.root not in canon:
                raise RunFailed(E_PROTOCOL, f"{call.describe()}: root {call.root} is not in the group")
            return self._add(("coll", canon, seq, pg), m.live_members(group), call)
        if call.root is not None and call.root not in group:
            raise RunFailed(E_PROTOCOL, f"{call.describe()}: root {call.root} is not in the group {list(group)}")
        return self._add(("coll", group, seq, pg), group, call)

    def transfer(self, call: Call, peer: int, tag: int, seq: int, is_send: bool, pg: int = 0) -> Rendezvous | None:
        """Add a send or recv on the `pg`-th process group holding both ends; the Rendezvous once both sides have
        called."""
        self._check_ranks(call, (peer,), "the peer")
        if peer == call.rank:
            raise RunFailed(E_PROTOCOL, f"{call.describe()} with itself as the peer")
        src, dst = (call.rank, peer) if is_send else (peer, call.rank)
        m = self.mirrors
        if m is not None:
            src, dst = m.canonical_pair(src, dst)
            if m.live_of(dst) == src:
                raise RunFailed(E_PROTOCOL, f"{call.describe()}: {_mirrored_pair(m.live, m.world, src, dst)}")
            return self._add(("p2p", src, dst, tag, seq, pg), (src, m.live_of(dst)), call)
        return self._add(("p2p", src, dst, tag, seq, pg), (src, dst), call)

    def _add(self, key: tuple[Any, ...], members: tuple[int, ...], call: Call) -> Rendezvous | None:
        if key in self.done_keys:
            raise RunFailed(E_PROTOCOL, f"{call.describe()} on {describe_key(key)}, which already ran (repeated seq?)")
        rv = self.pending.get(key)
        if rv is None:
            rv = self.pending[key] = Rendezvous(key, members)
        if call.rank in rv.calls:
            raise RunFailed(E_PROTOCOL, f"{call.describe()} on {describe_key(key)} twice")
        self._compare(rv, call)
        rv.calls[call.rank] = call
        if rv.missing:
            return None
        del self.pending[key]
        self.done_keys.add(key)
        return rv

    @staticmethod
    def _compare(rv: Rendezvous, call: Call) -> None:
        if not rv.calls:
            return
        first = next(iter(rv.calls.values()))
        if rv.key[0] == "p2p":
            if call.nbytes != first.nbytes:
                raise RunFailed(
                    E_MISMATCH,
                    f"transfer mismatch on {describe_key(rv.key)}: {first.describe()}; {call.describe()} "
                    "(send and recv sizes differ)",
                )
            if call.algo != first.algo:  # each end's NCCL_* (nccl_env): the one taken would be the first to arrive
                raise RunFailed(
                    E_MISMATCH,
                    f"transfer mismatch on {describe_key(rv.key)}: {first.describe()}; {call.describe()} "
                    "(send and recv algorithm options differ)",
                )
            return
        if call.signature() != first.signature():
            fields = ("kind", "size", "dtype", "root", "algorithm options", "reduction")
            diff = [n for n, a, b in zip(fields, first.signature(), call.signature(), strict=True) if a != b]
            raise RunFailed(
                E_MISMATCH,
                f"collective mismatch on {describe_key(rv.key)} ({', '.join(diff)} differ): "
                f"{first.describe()}; {call.describe()}",
            )

    def recv_issued(self, src: int, dst: int, tag: int, seq: int, pg: int = 0) -> bool:
        """Whether `dst` has issued the receive of transfer (src, dst, tag, seq, pg) and `src` not yet its send (False
        in a deduplicated run, whose mirrored ranks move no data)."""
        rv = None if self.mirrors is not None else self.pending.get(("p2p", src, dst, tag, seq, pg))
        return rv is not None and dst in rv.calls and src not in rv.calls

    def waiting_for(self, rank: int) -> list[Rendezvous]:
        """Pending rendezvous that still need a call from `rank`."""
        return [rv for rv in self.pending.values() if rank in rv.missing]


def _mirrored_pair(live: int, world: int, src: int, dst: int) -> str:
    """Why deduplication cannot run a transfer between two mirrors of one live rank, and which counts can."""
    gap = abs(dst - src)
    fits = [k for k in range(1, world + 1) if world % k == 0 and gap % k != 0]
    hint = (
        f"live-rank counts that can run it divide {world} but not {gap}: "
        + ", ".join(map(str, fits))
        + (" (every rank live: --dedup off)" if fits == [world] else "")
    )
    return (
        f"with {live} live ranks for {world}, ranks {src} and {dst} ({gap} apart) are mirrors of one live "
        f"rank (rank r is mirrored by r mod {live}), which cannot both send and receive this transfer; "
        f"{hint}. A pipeline whose stages are far apart in rank order (torchtitan puts the pipeline "
        "outermost) needs a live rank in every stage."
    )
