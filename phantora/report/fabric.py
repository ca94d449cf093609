"""PFC pause intervals and queue hot spots of a run, for the comparison and its plots.

Rows come from `RunData.pfc` (time_ns, node, port, prio, pause) and `RunData.queues` (time_ns, node,
port, prio, bytes).
"""

from __future__ import annotations

import numpy as np


def pause_intervals(pfc: np.ndarray, end_ns: int | None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(node, port) -> paused intervals [start, end) per priority, in time order.

    `pfc` rows are (time_ns, node, port, prio, pause). A second pause while paused extends the pause;
    a resume while running is ignored; a pause still open closes at `end_ns` (or its last frame).
    """
    open_at: dict[tuple[int, int, int], int] = {}
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    last = int(pfc[:, 0].max()) if len(pfc) else 0
    order = np.lexsort((pfc[:, 0],)) if len(pfc) else np.zeros(0, dtype=np.int64)
    for t, node, port, prio, pause in pfc[order]:
        key = (int(node), int(port), int(prio))
        if pause and key not in open_at:
            open_at[key] = int(t)
        elif not pause and key in open_at:
            out.setdefault(key[:2], []).append((open_at.pop(key), int(t)))
    stop = max(end_ns or 0, last)
    for key, t in open_at.items():
        out.setdefault(key[:2], []).append((t, stop))
    for spans in out.values():
        spans.sort()
    return dict(sorted(out.items()))


def queue_depths(queues: np.ndarray) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """(node, port) -> (times, bytes summed over priorities) from queue samples."""
    out: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    if not len(queues):
        return out
    keys = queues[:, 1:3]
    for node, port in np.unique(keys, axis=0):
        sel = queues[(keys[:, 0] == node) & (keys[:, 1] == port)]
        times, inverse = np.unique(sel[:, 0], return_inverse=True)
        depth = np.zeros(len(times), dtype=np.int64)
        np.add.at(depth, inverse, sel[:, 4])
        out[(int(node), int(port))] = (times, depth)
    return out


def hottest_port(queues: np.ndarray | None) -> tuple[tuple[int, int], np.ndarray, np.ndarray] | None:
    """The (node, port) with the deepest sampled queue, and its (times, depths); None without samples."""
    if queues is None or not len(queues):
        return None
    depths = queue_depths(queues)
    key = max(depths, key=lambda k: (int(depths[k][1].max()), -k[0], -k[1]))
    return key, *depths[key]
