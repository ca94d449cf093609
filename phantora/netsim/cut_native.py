"""A local partition worker's windows run in C++ (issue 38): `bridge.cut_unix`'s sockets handed to the engine's loop.

`phantora.netsim.cut_windows.run_windows` costs about ten cppyy calls, a msgpack frame each way and Python's
arithmetic per window, at every barrier of every run. On one machine the workers instead hand the connected
stream sockets of `bridge.cut_unix.UnixPeers` (their hellos checked) to ``ns3::PhantoraCutRunWindows``
(ns3-scratch/model/phantora-cut-windows.h): the same loop and window rules in C++, each barrier one
`bridge.cut_frame` frame per peer (a length, then a msgpack array: either loop reads the other's), every receive
bounded by the peers' timeouts and a closed peer named. This module makes that call and folds its counts into the
`WindowStats`. Over ZeroMQ / CurveZMQ (`bridge.cut_peers`, Ray) the Python loop runs.
"""

from __future__ import annotations

from typing import Any

from phantora.errors import PhantoraError
from phantora.netsim.cpp_errors import cpp_message
from phantora.netsim.cut_windows import (
    LAST,
    LOCKSTEP_NS,
    LOOKAHEAD,
    OUTPUT,
    REACT,
    RELEASE_LATER,
    RELEASE_SAME,
    SAMPLING_START,
    UNTIL,
    WindowStats,
    width_bucket,
)

HEADER = "phantora-cut-windows.h"
WHY = (LOOKAHEAD, RELEASE_LATER, RELEASE_SAME, LOCKSTEP_NS, UNTIL, OUTPUT, REACT, SAMPLING_START, LAST)  # kCutWhy
WIDTHS = 21  # kCutWidths: 0, 1, 2-9, then one bucket per decade
HEAD = 7  # stopped, barriers, windows, bytes out, lockstep rounds, run CPU ns, exchange wall ns


def _gbl() -> Any:
    import cppyy  # the worker's engine loaded it (phantora.netsim.packet)

    if not hasattr(cppyy.gbl.ns3, "PhantoraCutRunWindows"):
        cppyy.include(HEADER)
    return cppyy.gbl.ns3


def warm_up(net: Any, handle: Any = None) -> None:
    """Call the loop once doing nothing (cppyy's first-call cost, kept out of the figures); with `handle`
    (`native_peers`: a worker's own sockets) once more, since cppyy's first call with a real handle costs again.
    Once more with seven ints and no peers (still nothing run): a list's first conversion to the `std::vector` of the
    arguments is cppyy's too (about 46 ms, 117 M instructions, in a stepped worker's first round otherwise)."""
    _gbl().PhantoraCutRunWindows(net, _null(), [])
    _gbl().PhantoraCutRunWindows(net, _null(), [0] * 7)
    if handle is not None:
        _gbl().PhantoraCutRunWindows(net, handle, [])


def _null() -> Any:
    import cppyy

    return cppyy.nullptr


def native_peers(group: int, fds: list[int], timeout_s: float, first_timeout_s: float) -> Any:
    """The C++ side of one worker's sockets (`fds[g]` to worker g, -1 at `group`)."""
    return _gbl().PhantoraCutPeers(group, fds, max(int(timeout_s * 1000), 1), max(int(first_timeout_s * 1000), 1))


def exchange_rounds(handle: Any, first_seq: int, rounds: int, batch_bytes: int) -> tuple[float, float]:
    """(CPU s, wall s) of `rounds` barriers over `handle` (`native_peers`) with no window between, each sending every
    peer a `batch_bytes` batch: what a barrier alone costs the C++ loop (``ns3::PhantoraCutExchangeRounds``)."""
    try:
        cpu_ns, wall_ns = (int(x) for x in _gbl().PhantoraCutExchangeRounds(handle, first_seq, rounds, batch_bytes))
    except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
        raise PhantoraError(cpp_message(exc)) from None
    return cpu_ns / 1e9, wall_ns / 1e9


def bucket_name(index: int) -> str:
    """`width_bucket`'s name of the loop's width bucket `index`."""
    return width_bucket(index if index < 2 else 2 if index == 2 else 10 ** (index - 2))


def run_native(
    net: Any,
    handle: Any,
    *,
    group: int,
    lookahead_ns: int,
    until: int | None,
    stats: WindowStats,
    sampling: bool,
    reacting: bool,
    finish: bool = False,
) -> int | None:
    """`run_windows` in C++ over `handle` (`native_peers`); the same return and counts."""
    args = [group, lookahead_ns, -1 if until is None else until, int(sampling), int(reacting), stats.exchanges,
            int(finish)]  # fmt: skip
    try:
        out = [int(x) for x in _gbl().PhantoraCutRunWindows(net, handle, args)]
    except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
        raise PhantoraError(cpp_message(exc)) from None
    stopped, barriers, windows, bytes_out, lock, cpu_ns, wall_ns = out[:HEAD]
    stats.exchanges = barriers
    stats.windows += windows
    stats.bytes_out += bytes_out
    stats.lockstep_rounds += lock
    stats.run_cpu_s += cpu_ns / 1e9
    stats.exchange_wall_s += wall_ns / 1e9
    for name, n in zip(WHY, out[HEAD : HEAD + len(WHY)], strict=True):
        if n:
            stats.ended_by[name] = stats.ended_by.get(name, 0) + n
    for i, n in enumerate(out[HEAD + len(WHY) : HEAD + len(WHY) + WIDTHS]):
        if n:
            name = bucket_name(i)
            stats.widths[name] = stats.widths.get(name, 0) + n
    return None if stopped < 0 else stopped
