"""One NCCL group's transfers as a launch knows them, shared by its pairs (`Collective.launch`).

A world-size group (an uneven all-to-all, a batch_isend_irecv over all ranks) has n(n-1) pairs, and each pair is
rated in the whole group's schedule. Handing each pair its own copy of the group, relative to its own start and
bytes (`Collective.inflight` / `inflight_at`), makes every pair read n(n-1) entries: n^4 for the call. A
`LaunchGroup` is built once per launch (bridge/p2p_batch.py), never changes, and every pair of the launch refers to
it; what depends only on the group and the setting it runs in (its checks on a communicator, its hosts, its rating
for a start) is kept on it (`cached`), so a pair reads its own entry and the group's figures once made.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from phantora.errors import InputError

Pair = tuple[int, int]
At = tuple[int, int, int, int]  # (src, dst, start offset ns, bytes)
Later = tuple[int, int, int, int, int]  # (src, dst, k >= 1, start ns, bytes): a pair's k-th operation after its first
T = TypeVar("T")


@dataclass(frozen=True)
class LaunchGroup:
    """The (src, dst) pairs of one NCCL group, each with its start (ns, any origin) and bytes, in a fixed order:
    each pair's first operation; `later`, sorted, the operations a pair has after its first (a batch_isend_irecv with
    several sends to one peer: NCCL runs them one after another, enqueue.cc `scheduleP2pTasksToPlan`)."""

    pairs: tuple[Pair, ...]
    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    _memo: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    later: tuple[Later, ...] = ()

    def __post_init__(self) -> None:
        if not len(self.pairs) == len(self.starts) == len(self.sizes):
            raise InputError(
                f"a launch group's pairs ({len(self.pairs)}), starts ({len(self.starts)}) and sizes "
                f"({len(self.sizes)}) must be as many",
                field="launch",
            )
        if len(self.index) != len(self.pairs):
            raise InputError("a launch group's (src, dst) pairs must be distinct", field="launch")
        if self.sizes and min(self.sizes) < 0:
            raise InputError(f"a launch group's bytes must be >= 0, got {min(self.sizes)}", field="launch")
        if self.later:
            ks = [(a, b, k) for a, b, k, _, _ in self.later]
            if (
                ks != sorted(ks)
                or any((a, b) not in self.index or n < 0 for a, b, _, _, n in self.later)
                or any(
                    k != (ks[i - 1][2] + 1 if i and ks[i - 1][:2] == (a, b) else 1) for i, (a, b, k) in enumerate(ks)
                )
            ):
                raise InputError(
                    "a launch group's later operations must be sorted (src, dst, k, start, bytes) of its pairs, k "
                    "from 1 on, bytes >= 0",
                    field="launch",
                )

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.pairs, self.starts, self.sizes, self.later))

    @cached_property
    def index(self) -> dict[Pair, int]:
        """Each pair's place in `pairs`."""
        return {p: i for i, p in enumerate(self.pairs)}

    @cached_property
    def _ops(self) -> dict[Pair, tuple[tuple[int, int], ...]]:
        ops = {p: [(s, n)] for p, s, n in zip(self.pairs, self.starts, self.sizes, strict=True)}
        for a, b, k, s, n in self.later:
            if (a, b) in ops and k == len(ops[(a, b)]):
                ops[(a, b)].append((s, n))
        return {p: tuple(o) for p, o in ops.items()}

    def ops(self, pair: Pair) -> tuple[tuple[int, int], ...]:
        """Pair `pair`'s operations in NCCL's order: (start ns, bytes) each; () for a pair not in the group."""
        if not self.later:  # one a pair: no table of them (a world-size group's launch reads its own only)
            i = self.index.get(pair)
            return () if i is None else ((self.starts[i], self.sizes[i]),)
        return self._ops.get(pair, ())

    def passes(self, k: int) -> LaunchGroup:
        """The pairs' k-th operations (pass k of NCCL's plan: the head of each peer's queue; kept for the next
        pair): the group itself at k = 0 when no pair has more than one."""

        def make() -> LaunchGroup:
            got = [(p, o[k]) for p, o in self._ops.items() if len(o) > k]
            return LaunchGroup(tuple(p for p, _ in got), tuple(s for _, (s, _) in got), tuple(n for _, (_, n) in got))

        return self if k == 0 and not self.later else self.cached(("pass", k), make)

    @cached_property
    def ranks(self) -> frozenset[int]:
        """Every rank that sends or receives in the group."""
        return frozenset(r for pair in self.pairs for r in pair)

    @classmethod
    def relative(
        cls, own: Pair, nbytes: int, inflight: tuple[Pair, ...], inflight_at: tuple[At, ...] = ()
    ) -> LaunchGroup:
        """The group of a pair `own` moving `nbytes` from offset 0, given as `Collective.inflight` (the pairs, in
        order) and `inflight_at` (those starting at another offset or moving other bytes)."""
        at = {(a, b): (dt, n) for a, b, dt, n in inflight_at}
        at[own] = (0, nbytes)
        entries = [at.get(p, (0, nbytes)) for p in inflight]
        return cls(tuple(inflight), tuple(s for s, _ in entries), tuple(n for _, n in entries))

    def within(self, comm: tuple[int, ...]) -> LaunchGroup:
        """The group's pairs whose two ranks are both on `comm` (itself when all are; kept for the next pair)."""
        return self.cached(("within", comm), lambda: self if self.ranks <= set(comm) else self._only(set(comm)))

    def _only(self, members: set[int]) -> LaunchGroup:
        keep = [i for i, (a, b) in enumerate(self.pairs) if a in members and b in members]
        return LaunchGroup(
            tuple(self.pairs[i] for i in keep),
            tuple(self.starts[i] for i in keep),
            tuple(self.sizes[i] for i in keep),
            later=tuple(x for x in self.later if x[0] in members and x[1] in members),
        )

    def answer(self, own: Pair) -> tuple[tuple[Pair, ...], tuple[At, ...]]:
        """The group as pair `own` reads it relative to its own start and bytes: (`inflight`, `inflight_at`)."""
        i = self.index[own]
        t, nbytes = self.starts[i], self.sizes[i]
        return self.pairs, tuple(
            (a, b, s - t, n)
            for (a, b), s, n in zip(self.pairs, self.starts, self.sizes, strict=True)
            if (s, n) != (t, nbytes)
        )

    def cached(self, key: Hashable, make: Callable[[], T]) -> T:
        """`make()`, made once for this group and `key` (which must name everything `make` reads besides the
        group): what every pair of the launch would otherwise work out again."""
        try:
            got: T = self._memo[key]
        except KeyError:
            got = self._memo[key] = make()
        return got


def shared(launch: LaunchGroup | None, topo: object, key: tuple[Hashable, ...], make: Callable[[], T]) -> T:
    """`make()` for a pair of `launch` on topology `topo`: made once for the launch's pairs (`key` names everything
    else it reads; the topology is held with it, so that another one is told apart), every time without a launch."""
    if launch is None:
        return make()
    held, got = launch.cached(("topology", id(topo), *key), lambda: (topo, make()))
    return got if held is topo else make()
