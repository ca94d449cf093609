"""Steps in flight on NCCL's network p2p connections: a GPU's shared buffer slots, split among a channel's transfers.

A send/recv connection across nodes has no buffer of its own: net.cc gives p2p connections (set up without a
graph) shared buffers (`conn.shared`, NCCL_NET_SHARED_BUFFERS on by default), NCCL_SHARED_STEPS = 16 slots a
channel, and `ProxyAppend` (proxy.cc) groups the network ops of one call on the same channel of the same GPU into
one proxy operation, one sub each. `sendProxyProgress` and `recvProxyProgress` then let each sub run at most
`maxDepth = min(NCCL_STEPS, NCCL_SHARED_STEPS / nsubs)` steps ahead of what the GPU has consumed (the same code
in v2.17.1-1, v2.22.3-1, v2.29.2-1 and v2.30.7-1). A send/recv (one sub) keeps NCCL_STEPS = 8 in flight; an
all-to-all across two hosts of 8, whose 8 remote peers of a GPU share the same channels, 2 a peer. A connection
is bound by its sender's proxy and its receiver's, so by the busier of the two. A send relayed through another
GPU of the host (PXN) is served by the relay's proxy, which keeps an operation for each GPU whose sends it
relays on a channel (`connection->proxyAppendPtr = localPeers[tpLocalRank]->send.proxyAppend + channelId`, net.cc):
its subs are that sender's transfers through that relay on the channel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from phantora.collectives.nccl import tables as T

NCCL_SHARED_STEPS = 16  # net.cc: a GPU's shared p2p network buffer slots on one channel


def steps_in_flight(subs: int) -> int:
    """net.cc's maxDepth for a sub of a proxy operation of `subs` subs (at least one step)."""
    return max(1, min(T.NCCL_STEPS, NCCL_SHARED_STEPS // max(1, subs)))


def shared_depths(transfers: Iterable[tuple[int, int, int, list[int]]]) -> dict[tuple[int, int, int], int]:
    """Steps in flight on each (sender, receiver, channel) of a call's network transfers, given as (sender,
    receiver, the GPU whose proxy sends it: the sender's or its PXN relay's, the channel of each of its parts): the
    busier of the sending proxy's and the receiver's subs on the channel sets it."""
    parts = [(src, dst, proxy, c) for src, dst, proxy, ids in transfers for c in ids]
    sends = Counter((src, proxy, c) for src, _, proxy, c in parts)
    recvs = Counter((dst, c) for _, dst, _, c in parts)
    return {(s, d, c): steps_in_flight(max(sends[s, x, c], recvs[d, c])) for s, d, x, c in parts}
