"""Real mode's host-memory watcher (phantora/runtime/hostmem.py): a rank past its share of the machine says so once,
with the figures; the share is the available memory over the live ranks plus what the rank held at its start."""

from __future__ import annotations

import threading

from phantora.runtime import hostmem

GiB = 1024**3


def test_share_is_the_available_memory_over_the_ranks_plus_what_was_held() -> None:
    assert hostmem.share_bytes(4, 16 * GiB) == 4 * GiB
    assert hostmem.share_bytes(4, 16 * GiB, held=GiB // 2) == 4 * GiB + GiB // 2
    assert hostmem.share_bytes(4, None) is None


def test_a_rank_past_its_share_says_so_once_naming_the_fixes() -> None:
    readings = iter([GiB, 2 * GiB, 3 * GiB + 1, 4 * GiB, 5 * GiB])  # at start: 1 GiB held; share 2 + 1 = 3 GiB
    said: list[str] = []
    done = threading.Event()

    def used() -> int:
        value = next(readings, 5 * GiB)
        if value == 5 * GiB:
            done.set()
        return value

    thread = hostmem.watch(1, 4, period_s=0.001, used=used, available=8 * GiB, say=said.append)
    assert thread is not None
    thread.join(timeout=10)
    assert not thread.is_alive() and len(said) == 1
    line = said[0]
    assert line.startswith("phantora: rank 1 holds 3.00 GiB of host memory in real mode")
    assert "4 live ranks at that rate need about 12.00 GiB" in line and "8.00 GiB were available" in line
    assert "--phantom" in line and "--nproc" in line
    assert not done.is_set()  # it stopped reading at the first reading past the share
