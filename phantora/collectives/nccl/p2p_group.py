"""A group of p2p transfers with any bytes per pair, as NCCL runs it (uneven all-to-all, gather, scatter, a batch).

NCCL has no all-to-all of its own: torch's ProcessGroupNCCL runs all_to_all_single (even or uneven splits),
all_to_all's lists, gather and scatter as ncclGroupStart, an ncclSend and an ncclRecv per peer, ncclGroupEnd, and a
batch_isend_irecv the same way. At ncclGroupEnd NCCL's p2p scheduler (enqueue.cc) plans each rank's transfers
whatever their sizes: each by its round (`p2p_schedule`: the peer's delta, rounds of
NCCL_MAX_DEV_WORK_P2P_PER_BATCH, `ncclP2pChannelBaseForRound`), cut into channel parts by its own bytes
(`addP2pToPlan`: `p2p.TransferLayout`), LL inside a node up to 16 KiB a channel, else Simple. So one model rates
every such group, given its pairs' bytes:

- a transfer's channels, parts and protocol: its own bytes, as a lone send/recv's on the same communicator;
- latency: one launch and one step of its protocol over its link (the ring's figures, as `p2p_choice`), and
  across nodes NCCL's network overhead for each proxy op of the busier end's remote transfers, one per part and
  direction (2 x sum of their parts; an even all-to-all: 2 (n - ppn) parts);
- rate: each GPU's sends (and, alike, its receives) in flight move at the channels they run on, distinct channels
  counted once, each channel `channel_links(k)` NVLinks (across nodes NCCL's per-channel network figure whatever k,
  `p2p.net_links`, at most the NIC), the GPU's NVLink at most; a transfer has its part of that by its channels,
  and the lesser of its sender's and receiver's side. k is the GPU's fan-out, its sends (receives) in flight. The
  pairs' rates are set again as each transfer starts and ends (`p2p_group_ends.group_ends`, as
  `pci_p2p.group_ends` for a PCIe host), so a skewed group's large transfer speeds up once the small ones are done.

`channel_links`: measured at the two ends (tests/data/nccl_tests, `p2p.P2P_LINKS_PER_CHANNEL`): a GPU with one
peer in flight (sendrecv_perf) moves one NVLink a channel, up to 32 channels, so the halving is not a channel count
limit; a GPU sending to all its peers at once (alltoall_perf on 8 H100s) moves half a link a channel. No table has
a fan-out between, so it is linear in k between those ends: the least assumption that meets both and is monotone.
A group whose pairs are all equal is then rated as `p2p_choice` rates the all-to-all (`tests/test_p2p_group.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.chunking import refuse_empty_chunk, step_bytes
from phantora.collectives.nccl.p2p import auto_plan, transfer_layout
from phantora.collectives.nccl.p2p import channel_links as channel_links  # the test of its ends imports it here
from phantora.collectives.nccl.p2p_group_ends import group_ends
from phantora.collectives.nccl.p2p_group_ends import table as ends_table
from phantora.collectives.nccl.p2p_schedule import transfer_channel_ids
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import Choice, net_overhead_us, running_release

Pair = tuple[int, int]  # (sender, receiver) positions in the communicator


@dataclass(frozen=True)
class Part:
    """One transfer of the group as NCCL plans it: its channels (ids), protocol and whether it crosses nodes."""

    channels: tuple[int, ...]
    protocol: str
    remote: bool


@dataclass(frozen=True)
class GroupRating:
    """A group's transfers planned and timed: each pair's plan, end (ns after the group's origin) and latency."""

    parts: Mapping[Pair, Part]
    ends: Mapping[Pair, float]
    lat_us: Mapping[Pair, float]


def plan_parts(
    on: Platform, st: NcclSettings, hosts: tuple[Hashable, ...], sizes: Mapping[Pair, int], protocol: str = "auto"
) -> dict[Pair, Part]:
    """Each transfer's channels (by its sender's rounds on communicator `on`, whose position i is on host
    `hosts[i]`, in the schedule of the NCCL that runs), protocol (`protocol`, or NCCL's by size) and whether it
    crosses nodes."""
    layout = transfer_layout(on, st, any(n > 0 for n in sizes.values()))
    release = running_release(st)
    out = {}
    for (s, d), n in sizes.items():
        remote = hosts[s] != hosts[d]
        proto, nch = auto_plan(layout, on, st, not remote, n) if protocol == "auto" else (protocol, layout.channels(n))
        if proto == "LL" and n > 0:
            refuse_empty_chunk(step_bytes("LL", st) // 2, "a send/recv's LL step", "LL", st)
        chans = transfer_channel_ids(hosts, s, d, nch, layout.total, release, st.p2p_sched_group)
        out[(s, d)] = Part(tuple(chans), proto, remote)
    return out


def rate_group(
    on: Platform,
    st: NcclSettings,
    hosts: tuple[Hashable, ...],
    pairs: Mapping[Pair, tuple[int, int]],
    protocol: str = "auto",
) -> GroupRating:
    """The group of transfers `pairs` ((start ns, bytes) by (sender, receiver) position in `on`) planned and timed."""
    key = tuple(sorted(map(tuple.__add__, pairs.keys(), pairs.values())))  # nearly in order: about n^2 steps
    return _rate_group(on, st, hosts, key, protocol)


@lru_cache(maxsize=256)
def _rate_group(
    on: Platform,
    st: NcclSettings,
    hosts: tuple[Hashable, ...],
    key: tuple[tuple[int, int, int, int], ...],
    protocol: str,
) -> GroupRating:
    """`rate_group` on its canonical key (every pair of a group launched at one time asks the same)."""
    sizes = {(s, d): n for s, d, _, n in key}
    parts = plan_parts(on, st, hosts, sizes, protocol)
    pairs = tuple(parts)
    table = ends_table(
        pairs, [parts[p].channels for p in pairs], [parts[p].remote for p in pairs], [parts[p].protocol for p in pairs]
    )
    starts = np.array([t for _, _, t, _ in key], dtype=float)
    done = group_ends(on, table, starts, np.array([n for _, _, _, n in key], dtype=float))
    ends = {pair: float(e) for pair, e in zip(table.pairs, done, strict=True)}
    ovh = net_overhead_us(on, st)
    ops: dict[tuple[int, int], int] = defaultdict(int)  # (gpu, 0 send / 1 receive) -> its remote transfers' parts
    for (s, d), part in parts.items():
        if part.remote:
            ops[(s, 0)] += len(part.channels)
            ops[(d, 1)] += len(part.channels)
    lat = {}
    for (s, d), part in parts.items():
        pi = T.PROTOCOLS.index(part.protocol)
        hw = "net" if part.remote else "nvlink"
        lat[(s, d)] = T.BASE_LAT["ring"][pi] + T.HW_LAT[hw]["ring"][pi]
        if part.remote:  # the proxy posts one op per part and direction of each remote transfer in turn
            lat[(s, d)] += 2 * max(ops[(s, 0)], ops[(d, 1)]) * ovh
    return GroupRating(parts, ends, lat)


def rated_choice(rating: GroupRating, own: Pair, nbytes: int) -> Choice:
    """The choice of transfer `own` (`nbytes`, starting at the group's origin) in its group's `rating`: its protocol
    and channels, its latency, and its average rate over its time in the group's schedule, as its flows' caps
    (inside a node `peer_bw`, across nodes `net_bw`)."""
    part, end, lat = rating.parts[own], rating.ends[own], rating.lat_us[own]
    rate = nbytes / end if end > 0 else 0.0
    algbw = rate
    return Choice(
        "p2p",
        part.protocol,
        len(part.channels),
        lat,
        algbw,
        lat + end / 1000.0,
        0.0 if part.remote else rate,
        net_bw=rate if part.remote else 0.0,
    )
