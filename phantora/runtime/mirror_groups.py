"""Rank deduplication's shifted groups against the groups the program made.

Under `--dedup` a live rank stands for its mirrors, and a collective on a group stands for the same collective on
every shift of the group by the live count (collectives/mirrors.py). torch's `new_group` is called by every rank
with the group's full rank list, and its `split_group` by every rank of the parent with every split's list (so
DeviceMesh's splits too), so a live rank sees every group the program makes that way: where the program made a
group but never made one of its shifts, the mirrored ranks would not run the group's calls, and the shifted copies
would be traffic the program does not make. Such a collective is refused in one line. Groups made otherwise
(new_group with use_local_synchronization, the world) are not checked: a rank does not see the others' lists
there."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from phantora.collectives.mirrors import Mirrors
from phantora.errors import InputError

_MADE: dict[tuple[int, ...], str] = {}  # groups this process saw made (every rank's list) -> by which call
_LOCAL: set[tuple[int, ...]] = set()  # made by new_group(use_local_synchronization=True): not checked


def note(ranks: Iterable[int] | None, local: bool = False) -> None:
    """A `new_group(ranks)` call this rank made (member or not); None: the world, not checked."""
    if ranks is None:
        return
    key = tuple(sorted(int(r) for r in ranks))
    if local:
        _LOCAL.add(key)
    else:
        _MADE.setdefault(key, "new_group")


def note_split(parent: Sequence[int], split_ranks: Iterable[Iterable[int]]) -> None:
    """A `split_group` call this rank made (member or not): `parent` the parent group's global ranks by group rank,
    `split_ranks` every split's group ranks in the parent, as torch takes them."""
    for ranks in split_ranks:
        _MADE.setdefault(tuple(sorted(parent[int(r)] for r in ranks)), "split_group")


def check(group: tuple[int, ...], world: int, live: int, what: str) -> None:
    """Refuse a collective (`what`) on `group` whose shifted copies under `live` of `world` ranks include a group
    the program never made, where the program made `group` itself with new_group or split_group."""
    key = tuple(sorted(group))
    if live >= world or key not in _MADE or key in _LOCAL:
        return
    for copy in Mirrors(world, live).copies(key)[1:]:
        if tuple(sorted(copy)) not in _MADE:
            raise InputError(
                f"{what} on group {list(key)} ({_MADE[key]}) stands, under rank deduplication ({live} live processes "
                f"for {world} ranks), for its copy {sorted(copy)} too, which the program never made: those ranks "
                "would not run it; run with --dedup off",
                field="--dedup",
            )


def reset() -> None:
    """Forget the groups seen (tests)."""
    _MADE.clear()
    _LOCAL.clear()
