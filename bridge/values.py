"""The value channel: the bytes of object collectives, carried between rank processes by the coordinator.

Phantom tensors carry no values, yet torch's object collectives (`all_gather_object`, `broadcast_object_list`,
`send_object_list`, ...) must deliver real objects: DCP's plans, a pipeline's stage metadata. A rank posts the
bytes torch pickled (`value`, opaque here: never unpickled by the coordinator) under its group and a key, then
issues the timed collectives; once they complete every member has posted, and `values` returns one entry per
member of the group. The time is the network model's, as for any collective of that size.

Rank deduplication: a mirror rank has no process; the live rank it mirrors posts for it (its value stands for
its mirrors', as a live rank's tensors stand for theirs). Groups meet under their canonical shift, as collectives do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.errors import RunFailed
from bridge.protocol import E_PROTOCOL
from phantora.collectives.mirrors import Mirrors


@dataclass
class _Entry:
    data: dict[int, bytes] = field(default_factory=dict)  # live rank -> its bytes
    readers: set[int] = field(default_factory=set)  # live ranks yet to read


class ValueBoard:
    """Posted values by (canonical group, key, pg: the process group over its ranks); an entry is dropped once its
    readers have read it."""

    def __init__(self, mirrors: Mirrors) -> None:
        self.mirrors = mirrors
        self._board: dict[tuple[tuple[int, ...], int, int], _Entry] = {}

    def _key(self, group: list[int], key: int, pg: int = 0) -> tuple[tuple[int, ...], int, int]:
        g = tuple(int(r) for r in group)
        return (self.mirrors.canonical(g)[0] if self.mirrors.active else g), key, pg

    def _entry(self, group: list[int], key: int, pg: int = 0) -> _Entry:
        k = self._key(group, key, pg)
        entry = self._board.get(k)
        if entry is None:
            entry = self._board[k] = _Entry(readers=set(self.mirrors.live_members(k[0])))
        return entry

    def post(self, rank: int, group: list[int], key: int, data: bytes, reads: bool = True, pg: int = 0) -> None:
        """Live `rank`'s bytes for its calls on `group`'s process group `pg` under `key`; `reads` False: it will not
        read them back."""
        live = self.mirrors.live_of(rank)
        entry = self._entry(group, key, pg)
        if live in entry.data:
            raise RunFailed(E_PROTOCOL, f"rank {rank} posted a value twice under key {key} of group {group}")
        entry.data[live] = data
        if not reads:
            entry.readers.discard(live)
            self._drop_if_read(group, key, entry, pg)

    def take(self, rank: int, group: list[int], key: int, pg: int = 0) -> list[bytes | None]:
        """The bytes of each member of `group` (a mirror's: its live rank's; None: not posted)."""
        entry = self._entry(group, key, pg)
        out = [entry.data.get(self.mirrors.live_of(int(g))) for g in group]
        entry.readers.discard(self.mirrors.live_of(rank))
        self._drop_if_read(group, key, entry, pg)
        return out

    def _drop_if_read(self, group: list[int], key: int, entry: _Entry, pg: int = 0) -> None:
        if not entry.readers:
            self._board.pop(self._key(group, key, pg), None)

    def __len__(self) -> int:
        return len(self._board)
