"""`NoNetworkClient`: a rank client without a network, where every transfer takes zero time.

Only for measuring phantora's own interception overhead and for compute-only runs of one process
(PHANTORA_NETWORK=none); results from it say `"network": "none"`. Real runs use the bridge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NoNetworkClient:
    """Implements the rank client API; a collective completes at its issue time."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank = rank
        self.world = world
        self.clock = 0
        self._issued: dict[int, int] = {}
        self.results: dict[str, Any] | None = None
        self._values: dict[tuple[tuple[int, ...], int, int], bytes] = {}

    def _new(self, t: int) -> int:
        h = len(self._issued) + 1
        self._issued[h] = t
        self.clock = max(self.clock, t)
        return h

    def collective(
        self,
        *,
        group: Sequence[int],
        seq: int,
        kind: str,
        nbytes: int,
        dtype: str,
        root: int | None,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        redop: str = "sum",
        pg: int = 0,
    ) -> int:
        return self._new(t_issue_ns)

    def post_value(self, *, group: Sequence[int], key: int, data: bytes, reads: bool = True, pg: int = 0) -> None:
        """An object collective's bytes (bridge.values): one process holds only its own."""
        self._values[(tuple(group), key, pg)] = data

    def take_values(self, *, group: Sequence[int], key: int, pg: int = 0) -> list[bytes | None]:
        mine = self._values.pop((tuple(group), key, pg), None)
        return [mine if r == self.rank else None for r in group]

    def lost(self, handle: int) -> list[tuple[int, int]]:
        """No network: nothing is ever lost."""
        return []

    def p2p(
        self,
        *,
        peer: int,
        is_send: bool,
        tag: int,
        seq: int,
        nbytes: int,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        handoff: int | None = None,
        gate: Sequence[int] = (),
        pg: int = 0,
    ) -> int:
        return self._new(t_issue_ns)

    def wait(self, handle: int, deadline: float | None = None) -> int:
        return self._issued[handle]

    def test(self, handle: int, t_now_ns: int) -> int | None:
        t = self._issued[handle]
        return t if t <= t_now_ns else None

    def advance_clock(self, t_ns: int) -> None:
        self.clock = max(self.clock, t_ns)

    def finish(self, t_ns: int, results: dict[str, Any]) -> None:
        self.results = results

    def close(self) -> None:
        pass
