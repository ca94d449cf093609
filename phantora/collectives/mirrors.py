"""Rank deduplication: K live rank processes stand for an N-rank SPMD job (K divides N).

Live rank l (0 <= l < K) stands for the ranks l, l+K, l+2K, ... (its *mirrors*). In an SPMD job
the mirrors run the same ops, at the same times, as the live rank, on process groups that are
the live rank's groups shifted by a multiple of K: shift j maps rank g to (g + j*K) mod N. So a
collective one live rank issues on group G stands for the same collective on every distinct
shift of G (for FSDP on the world group, one collective; for tensor parallelism inside a host of
8 with K = 8, N/8 copies). The network sees every copy's flows; a live rank's part is done when
the part of its last mirror is (the class moves at the pace of its slowest member).

The layout must be symmetric under the shift: the shifts of a group are either the group itself
or disjoint from it. Otherwise the job is not periodic in K (for example TP groups of 8 with
K = 4), and `copies` says so: choose K as a multiple of the innermost parallel dimension.
"""

from __future__ import annotations

from phantora.errors import PhantoraError


class NotPeriodicError(PhantoraError):
    """The job's groups are not symmetric under the shift by the number of live ranks."""


class Mirrors:
    """The shift symmetry of a job of `world` ranks run by `live` processes."""

    def __init__(self, world: int, live: int) -> None:
        if live < 1 or world % live:
            raise ValueError(f"live ranks ({live}) must divide the world size ({world})")
        self.world = world
        self.live = live
        self.shifts = world // live
        self._copies: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
        self._canon: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}

    @property
    def active(self) -> bool:
        return self.live < self.world

    def live_of(self, rank: int) -> int:
        return rank % self.live

    def shift(self, rank: int, j: int) -> int:
        return (rank + j * self.live) % self.world

    def shift_group(self, group: tuple[int, ...], j: int) -> tuple[int, ...]:
        k, n = j * self.live, self.world
        return tuple((g + k) % n for g in group)

    def live_members(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """The live ranks that must issue a collective on `group` (or on one of its shifts)."""
        return tuple(sorted({g % self.live for g in group}))

    def canonical(self, group: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """One representative of the group's shifts, and the shift that maps `group` onto it.

        Every live member's call meets under it; a root rank is carried to it by the same shift.
        """
        canon = self._canon.get(group)
        if canon is None:
            canon = min((self.shift_group(group, j), j) for j in range(self.shifts))
            self._canon[group] = canon
        return canon

    def copies(self, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The distinct shifts of `group`, the group itself first."""
        cached = self._copies.get(group)
        if cached is None:
            out: list[tuple[int, ...]] = []
            seen: set[frozenset[int]] = set()
            covered: set[int] = set()
            for j in range(self.shifts):
                g = self.shift_group(group, j)
                key = frozenset(g)
                if key in seen:
                    continue
                if covered & key:
                    raise NotPeriodicError(
                        f"rank deduplication with {self.live} live ranks for {self.world}: the group "
                        f"{_short(group)} shifted by {j * self.live} ranks overlaps it without being it, so "
                        f"the job is not periodic in {self.live} ranks; choose a number of live ranks that "
                        "is a multiple of the innermost parallel group size, or turn deduplication off",
                    )
                seen.add(key)
                covered |= key
                out.append(g)
            cached = self._copies[group] = tuple(out)
        return cached

    def copy_comm(self, group: tuple[int, ...], copy: tuple[int, ...], comm: tuple[int, ...]) -> tuple[int, ...]:
        """The communicator the shift of `group` onto `copy` runs on, for a call of `group` on `comm` (a grouped
        send/recv's): the mirrors issue on the shift of the live rank's process group, which is `comm` itself
        (in its order) when the shift maps it onto itself, as the world group, else `comm` shifted."""
        for j in range(self.shifts):
            if self.shift_group(group, j) == copy:
                moved = self.shift_group(comm, j)
                return comm if set(moved) == set(comm) else moved
        raise ValueError(f"{_short(copy)} is no shift of {_short(group)}")

    def canonical_root(self, group: tuple[int, ...], root: int | None) -> int | None:
        """A root rank of `group`, carried to the group's canonical shift."""
        return None if root is None else self.shift(root, self.canonical(group)[1])

    def canonical_pair(self, src: int, dst: int) -> tuple[int, int]:
        """A transfer's representative: shifted so that its source is a live rank."""
        j = src // self.live
        return src - j * self.live, (dst - j * self.live) % self.world


def _short(group: tuple[int, ...]) -> str:
    items = list(group)
    return str(items) if len(items) <= 16 else f"[{', '.join(map(str, items[:8]))}, ... ({len(items)} ranks)]"
