"""Receives from any source (gloo's `recvAnysource`): which send each one takes, decided by the coordinator.

A rank's `recv` without a source names the ranks that may send it (its group's others, each with the `pg` of the
process group they share) instead of one peer. The coordinator gives it, once every live rank is blocked (so what it
knows does not depend on the order messages arrived in), the matching send issued earliest in virtual time: among the
candidates' sends to it with its tag whose receive is not yet issued, each candidate's lowest sequence number (a pair's
transfers stay in order), the least issue time, ties to the lower rank. It waits while a candidate that has not sent
could still issue an earlier send (`lower_bound`: a rank released before that time); when nothing can move without
passing the send's time, the send issued earliest wins. The receive then joins that transfer's rendezvous, as a recv
naming the source would have.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.matching import Call, Matcher


@dataclass
class AnyRecv:
    """One receive from any of `peers` ((global rank, pg) pairs), not yet given its send."""

    call: Call
    tag: int
    peers: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Pick:
    """The send an `AnyRecv` takes: from `src`, its transfer number `seq` on process group `pg`, issued at `t`."""

    src: int
    seq: int
    pg: int
    t: int


class AnySources:
    """The receives from any source not yet given their send, in a deterministic order."""

    def __init__(self) -> None:
        self.open: list[AnyRecv] = []

    def __bool__(self) -> bool:
        return bool(self.open)

    def add(self, a: AnyRecv) -> None:
        self.open.append(a)

    def of(self, rank: int, handle: int) -> AnyRecv | None:
        """The open receive of `rank` under `handle`, if any."""
        return next((a for a in self.open if a.call.rank == rank and a.call.handle == handle), None)

    def in_turn(self) -> list[AnyRecv]:
        """The open receives that may be given a send now: by (issue time, rank, handle), and of one rank's receives
        with one tag only the first (a later one must not take the send an earlier one is owed)."""
        seen: set[tuple[int, int]] = set()
        out = []
        for a in sorted(self.open, key=lambda a: (a.call.rank, a.call.handle)):
            if (a.call.rank, a.tag) not in seen:
                seen.add((a.call.rank, a.tag))
                out.append(a)
        return sorted(out, key=lambda a: (a.call.t, a.call.rank, a.call.handle))

    @staticmethod
    def sends(a: AnyRecv, matcher: Matcher) -> dict[int, Pick]:
        """Each candidate's first send to `a`'s rank with its tag whose receive is not issued: src -> Pick."""
        me = a.call.rank
        pgs = dict(a.peers)
        best: dict[int, Pick] = {}
        for key, rv in matcher.pending.items():
            if key[0] != "p2p" or key[2] != me or key[3] != a.tag or me in rv.calls:
                continue
            src, seq, pg = key[1], key[4], key[5]
            if pgs.get(src) != pg or src not in rv.calls:
                continue
            if src not in best or seq < best[src].seq:
                best[src] = Pick(src, seq, pg, rv.calls[src].t)
        return best

    @staticmethod
    def first(sends: dict[int, Pick]) -> Pick | None:
        """The send issued earliest, ties to the lower rank."""
        return min(sends.values(), key=lambda p: (p.t, p.src), default=None)

    @staticmethod
    def may_precede(a: AnyRecv, pick: Pick, sends: dict[int, Pick], lower: dict[int, int]) -> list[int]:
        """The candidates without a send that could still issue one before `pick` (`lower`: each rank's earliest
        possible next issue time), ties counted for a lower rank."""
        return [
            r for r, _ in a.peers if r not in sends and (lower[r] < pick.t or (lower[r] == pick.t and r < pick.src))
        ]
