"""A plain gloo group's call made off the rank's own thread runs on gloo alone, unsimulated (backend.py `gloo_sync`).

A plain gloo group's call is a synchronisation the rank session times on the thread that runs the program (its
host clock, its calls to the coordinator). A thread the program starts has a host clock of its own and its GPU work,
NCCL collectives, sends and receives are charged (host_clocks.py, session.py `_thread_issue`), but its gloo calls
are not: DCP's `async_save` runs its plan exchange in one, on the gloo group torchtitan makes for it. Such a call,
from any thread other than the group's maker, is what it was before gloo groups were synchronisations: the real gloo
call, whose wait waits for gloo and then runs the call's finish (an average's divide), with no simulated time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class GlooOnlyWork(dist.Work):
    """The gloo works of one call made off the rank's thread; `wait` waits for them, then runs `finalize`."""

    def __init__(self, works: list[Any], result: list[torch.Tensor], finalize: Callable[[], None] | None) -> None:
        super().__init__()
        self._works = works
        self._first = works[0] if works else None  # its source rank, for a recv from any source
        self._result = result
        self._finalize = finalize

    def wait(self, timeout: Any = None) -> bool:
        works, self._works = self._works, []
        for w in works:
            w.wait()
        fin, self._finalize = self._finalize, None
        if fin is not None:
            fin()
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return not self._works

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def _source_rank(self) -> int:
        """gloo's answer for a recv from any source (-1 before its wait)."""
        return int(self._first._source_rank()) if self._first is not None else -1


def off_thread(home: int) -> bool:
    """The caller is not the thread `home` (the one that made the group: the rank's own)."""
    return threading.get_ident() != home
