"""When each transfer of a p2p group ends: its rates (nccl/p2p_group.py's docstring) set again at every start and
end, updated only where they change.

A transfer's rate is the lesser of its two sides'; a side is a GPU's sends (or receives) in flight, across nodes or
inside one (`side = 2 gpu + remote`), and its rate depends on that side's distinct channels and channel count and
on the GPU's fan-out only. So when a transfer starts or ends, only the transfers sharing its sender or its receiver
are rated again (about 2n of a world-size group's n^2), and the event loop keeps every running transfer's bytes left
in one array. The arithmetic is the same, operation for operation, as rating every running transfer at every event
(what this module replaced, `tests/test_p2p_group.py`; `bench/bench_p2p_group_scale.py` compares the ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.p2p import (
    LL128_SHARE,
    P2P_LINKS_PER_CHANNEL,
    channel_links,
    net_channel_bw,
    net_links,
)
from phantora.collectives.nccl.platform import Platform

Pair = tuple[int, int]  # (sender, receiver) positions in the communicator
ALL_PEERS = P2P_LINKS_PER_CHANNEL["all_to_all"]
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS: a channel id is below it


@dataclass(frozen=True)
class Table:
    """A group's transfers as arrays (one row a pair, in `pairs` order)."""

    pairs: tuple[Pair, ...]
    src: np.ndarray
    dst: np.ndarray
    remote: np.ndarray  # bool
    nch: np.ndarray  # float: the transfer's channels
    chans: tuple[tuple[int, ...], ...]  # its distinct channel ids
    ll: np.ndarray  # bool: LL
    ll128: np.ndarray  # bool: LL128


def table(pairs: tuple[Pair, ...], channels: list[tuple[int, ...]], remote: list[bool], protocols: list[str]) -> Table:
    """The arrays of a group's transfers: each pair's channel ids (parts in order), whether it crosses nodes and its
    protocol, in `pairs` order."""
    proto = np.array(protocols)
    return Table(
        pairs,
        np.array([p[0] for p in pairs], dtype=np.int64),
        np.array([p[1] for p in pairs], dtype=np.int64),
        np.array(remote, dtype=bool),
        np.array([len(c) for c in channels], dtype=float),
        tuple(tuple(set(c)) for c in channels),
        proto == "LL",
        proto == "LL128",
    )


class _Sides:
    """Each GPU's fan-out one way (its sends, or its receives) in flight, and each side's channels in use (a count
    per channel id), distinct channel count and sum of its transfers' channels: plain numbers, one event at a time."""

    def __init__(self, n: int) -> None:
        self.fan = [0] * n
        self.uses = [[0] * MAX_CHANNELS for _ in range(2 * n)]
        self.chans = [0.0] * (2 * n)
        self.whole = [0.0] * (2 * n)

    def join(self, gpu: int, side: int, nch: float, chans: tuple[int, ...]) -> None:
        self.fan[gpu] += 1
        self.whole[side] += nch
        uses = self.uses[side]
        for c in chans:
            uses[c] += 1
            if uses[c] == 1:
                self.chans[side] += 1

    def leave(self, gpu: int, side: int, nch: float, chans: tuple[int, ...]) -> None:
        self.fan[gpu] -= 1
        self.whole[side] -= nch
        uses = self.uses[side]
        for c in chans:
            uses[c] -= 1
            if not uses[c]:
                self.chans[side] -= 1


class _Slots:
    """The running transfers, one slot each, in order of (sender, remote) so that a GPU's sends are two slices
    (inside its node, across): bytes left, rate, end threshold, and each side's share (`mine`). An ended transfer
    keeps its slot with inf bytes left (never the least time, never done) until the slots are packed."""

    def __init__(self, rows: np.ndarray, left: np.ndarray, t: Table, n: int) -> None:
        order = np.lexsort((t.remote[rows], t.src[rows]))
        self.row = rows[order]
        self.left = left[order]
        self.live = len(rows)
        self.rate = np.ones(len(rows))
        self.mine = (np.ones(len(rows)), np.ones(len(rows)))  # sends', receives' shares
        self._index(t, n)

    def _index(self, t: Table, n: int) -> None:
        """Each GPU's slots each way, by `row`: per side (inside its node, across) the slots (a slice for its sends),
        their channels, and their LL and LL128 flags where it has some (else None)."""
        row = self.row
        nch, ll, ll128 = t.nch[row], t.ll[row], t.ll128[row]
        src, dst, rem = t.src[row], t.dst[row], t.remote[row].astype(np.int64)
        cut = np.searchsorted(src * 2 + rem, np.arange(2 * n + 1)).tolist()
        by_dst = np.lexsort((rem, dst))
        at = np.searchsorted((dst * 2 + rem)[by_dst], np.arange(2 * n + 1)).tolist()
        sides: tuple[list[Any], list[Any]] = ([], [])
        for side in range(2 * n):
            for way, slots in ((0, slice(cut[side], cut[side + 1])), (1, by_dst[at[side] : at[side + 1]])):
                lls = ll[slots], ll128[slots]
                sides[way].append((slots, nch[slots], *(f if f.any() else None for f in lls)))
        self.sides = sides
        self.sends = [slice(cut[2 * g], cut[2 * g + 2]) for g in range(n)]
        self.recvs = [by_dst[at[2 * g] : at[2 * g + 2]] for g in range(n)]

    def pack(self, t: Table, n: int) -> None:
        """Drop the ended transfers' slots."""
        keep = np.flatnonzero(np.isfinite(self.left))
        self.row, self.left, self.rate = self.row[keep], self.left[keep], self.rate[keep]
        self.mine = (self.mine[0][keep], self.mine[1][keep])
        self._index(t, n)


class _Group:
    """A group's running transfers and their rates, rated again where a transfer starts or ends."""

    def __init__(self, on: Platform, t: Table, sizes: np.ndarray) -> None:
        n = on.nranks
        self.on, self.t, self.n, self.sizes = on, t, n, sizes
        self.ways = (_Sides(n), _Sides(n))
        self.gpus = (t.src.tolist(), t.dst.tolist())
        self.sides = ((t.src * 2 + t.remote).tolist(), (t.dst * 2 + t.remote).tolist())
        self.nchs = t.nch.tolist()
        self.link = T.NVLINK_BW_PER_LINK[on.arch]
        self.net_channel = net_channel_bw(on, "all_to_all") / ALL_PEERS  # a channel's share per NVLink-equivalent
        self.slots = _Slots(np.zeros(0, dtype=np.int64), np.zeros(0), t, n)
        self.moved: tuple[set[int], set[int]] = (set(), set())  # GPUs whose sends / receives started or ended
        self.buf, self.ended = np.empty(0), np.empty(0, dtype=bool)

    def join(self, rows: np.ndarray) -> None:
        """Transfers `rows` start: the slots are made again and every transfer rated."""
        for r in rows.tolist():
            for w in (0, 1):
                self.ways[w].join(self.gpus[w][r], self.sides[w][r], self.nchs[r], self.t.chans[r])
        s = self.slots
        live = np.isfinite(s.left)
        self.slots = _Slots(
            np.concatenate([s.row[live], rows]), np.concatenate([s.left[live], self.sizes[rows]]), self.t, self.n
        )
        self.done_at = 1e-6 * self.sizes[self.slots.row]
        for g in range(self.n):
            self._share(0, g)
            self._share(1, g)
        self.slots.rate = np.minimum(*self.slots.mine)
        self.moved[0].clear()
        self.moved[1].clear()

    def leave(self, slots: np.ndarray) -> np.ndarray:
        """The transfers in `slots` end: their rows."""
        s = self.slots
        rows = s.row[slots]
        for r in rows.tolist():
            for w in (0, 1):
                self.ways[w].leave(self.gpus[w][r], self.sides[w][r], self.nchs[r], self.t.chans[r])
                self.moved[w].add(self.gpus[w][r])
        s.left[slots] = np.inf
        s.live -= len(slots)
        if 4 * (len(s.row) - s.live) > len(s.row) and s.live:
            s.pack(self.t, self.n)
            self.done_at = 1e-6 * self.sizes[s.row]
        return rows

    def rerate(self) -> None:
        """Rate again the transfers sharing a sender or a receiver with one that started or ended."""
        s = self.slots
        sends, recvs = self.moved
        for g in sends:
            self._share(0, g)
        for g in recvs:
            self._share(1, g)
        for at in [s.sends[g] for g in sends] + [s.recvs[g] for g in recvs]:
            s.rate[at] = np.minimum(s.mine[0][at], s.mine[1][at])
        sends.clear()
        recvs.clear()

    def _share(self, way: int, gpu: int) -> None:
        """Set `mine` of GPU `gpu`'s transfers one way: each one's share of its side (bytes per ns)."""
        on, s, w = self.on, self.slots, self.ways[way]
        per = float(channel_links(w.fan[gpu], self.n - 1))  # a number: fan[gpu] is one
        for remote in (0, 1):
            side = 2 * gpu + remote
            whole = w.whole[side]
            if not whole:
                continue  # none of them runs
            at, nch, ll, ll128 = s.sides[way][side]
            chans = w.chans[side]
            if remote:
                total = chans * net_links(per) * self.net_channel
                if on.nic_bw:
                    total = min(total, float(on.nic_bw))
            else:
                total = min(float(on.gpu_intra_bw), chans * per * self.link)
            mine = total * nch / whole
            if ll is not None:
                ll_cap = T.LL_MAX_BW[on.arch][0] * nch / whole  # LL's ceiling, shared as the channels are
                mine = np.where(ll, np.minimum(mine * 0.5, ll_cap), mine)  # half of each LL line is flags
            if ll128 is not None:
                mine = np.where(ll128, mine * LL128_SHARE, mine)
            s.mine[way][at] = mine


def group_ends(on: Platform, t: Table, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """When each transfer ends (ns): those started and not done move at their rates (nccl/p2p_group.py), set again
    at every start and end (as `pci_p2p.group_ends` does for a PCIe host's links)."""
    ends = np.where(sizes <= 0, starts, np.nan).astype(float)
    waiting = np.flatnonzero(sizes > 0)
    waiting = waiting[np.argsort(starts[waiting], kind="stable")]  # not started yet, by start
    first = 0  # waiting[first:] have not started
    g = _Group(on, t, sizes.astype(float))
    now = float(starts.min()) if len(starts) else 0.0
    while first < len(waiting) or g.slots.live:
        joined = first + int(np.searchsorted(starts[waiting[first:]], now, side="right"))
        if joined > first:
            g.join(waiting[first:joined])
            first = joined
        s = g.slots
        if not s.live:
            now = float(starts[waiting[first]])
            continue
        g.rerate()
        if len(g.buf) != len(s.left):  # scratch space, so that an event allocates nothing of the group's size
            g.buf, g.ended = np.empty(len(s.left)), np.empty(len(s.left), dtype=bool)
        step = float(np.divide(s.left, s.rate, out=g.buf).min())
        if first < len(waiting) and starts[waiting[first]] - now < step:
            step = float(starts[waiting[first]] - now)
        now += step
        s.left -= np.multiply(s.rate, step, out=g.buf)
        done = np.flatnonzero(np.less_equal(s.left, g.done_at, out=g.ended))
        if len(done):
            ends[g.leave(done)] = now
    return ends
