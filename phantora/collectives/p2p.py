"""All-to-all (pairwise rounds or direct) and send/recv: flows between peer pairs."""

from __future__ import annotations

from collections.abc import Callable

from phantora.collectives.dag import DagBuilder, chunks_of, split
from phantora.collectives.relay_steps import relayed_chunks

Relay = Callable[[int, int], "int | None"]  # (src, dst) position -> the position a transfer is relayed through
ChannelMap = Callable[[int, int, int], list[int]]  # (src, dst, parts) -> the channel of each part (NCCL's p2p)
ChunkOf = Callable[[int, int, int], int]  # (src, dst, transfer bytes) -> the bytes of each of its steps (NCCL's)
Depth = Callable[[int, int, int], int]  # (src, dst, channel id) -> steps in flight on that part's connection


def _pair(
    b: DagBuilder,
    src: int,
    dst: int,
    size: int,
    channels: int,
    tag: str,
    deps: tuple[int, ...],
    delay: int,
    relay: Relay | None = None,
    channel_map: ChannelMap | None = None,
    chunk: ChunkOf | None = None,
    window: int = 1,
    depth: Depth | None = None,
    grouped: bool = False,
) -> list[int]:
    """One transfer as `channels` parallel flows (one ECMP key each). With a relay position (NCCL's PXN), each
    part crosses NVLink to the relay and leaves through the relay's NIC; coarse (no slots), both hops at once (the
    steady state of the relay's chunk pipeline). `channel_map` gives the parts NCCL's p2p channel ids (else
    0..channels-1); the flow names keep the part index. `chunk` (the chunked granularity): each part is its
    channel's steps, up to `window` of them in flight on its connection (`DagBuilder.add_chunks`; `depth`, where
    given, sets a part's own). Under NCCL's model a relay's network step goes once its NVLink step is in the relay's
    buffer and its tail flag seen, and the NVLink step a window on waits for that network step's end
    (`relay_steps.relayed_chunks`), so a slow leg on either side paces the other. `grouped`: across hosts the
    receiver posts each step's receive with those of the call's other grouped transfers from the same sending
    proxy on the channel (`DagBuilder.grouped_cts`)."""
    via = relay(src, dst) if relay is not None else None
    ids = channel_map(src, dst, channels) if channel_map is not None else list(range(channels))
    step = chunk(src, dst, size) if chunk is not None else 0
    out = []
    for c, part in enumerate(split(size, channels)):
        name = f"{tag}/ch{c}" if channels > 1 else tag
        sizes = chunks_of(part, step) if step else [part]
        w = depth(src, dst, ids[c]) if depth is not None else window
        if via is None:
            out.append(b.add_chunks(src, dst, sizes, name, ids[c], deps, delay, window=w, grouped=grouped)[-1])
        elif chunk is None or b.credit_ns is None:  # coarse, or no slots (not NCCL's model): side by side
            out.append(b.add_chunks(src, via, sizes, f"{name}/pxn", ids[c], deps, delay, window=w)[-1])
            out.append(b.add_chunks(via, dst, sizes, name, ids[c], deps, delay, src, window=w, grouped=grouped)[-1])
        else:  # each network step sends what its NVLink step wrote; its end frees that step's slot
            nvlink, net = relayed_chunks(b, src, via, dst, sizes, name, ids[c], deps, delay, w, grouped)
            out += (nvlink[-1], net[-1])
    return out


def all_to_all(
    b: DagBuilder,
    n: int,
    nbytes: int,
    channels: int,
    *,
    pairwise: bool,
    step_delay_ns: int,
    name: str,
    relay: Relay | None = None,
    channel_map: ChannelMap | None = None,
    chunk: ChunkOf | None = None,
    window: int = 1,
    depth: Depth | None = None,
    grouped: bool = True,
) -> None:
    """Each position r sends block j of its `nbytes` send buffer (split in n) to every other position j.

    Pairwise: n - 1 rounds; in round k, r sends to (r + k) mod n and receives from (r - k) mod n.
    A round's send waits until the sender's previous send and previous receive have both arrived,
    so the rounds run one after another (each rank's round boundary is a local barrier with its two
    partners). Direct: every transfer at once, no deps; `grouped`: across hosts a receiver posts the receives
    from one sending proxy on a channel together (NCCL_NET_SHARED_COMMS, `DagBuilder.grouped_cts`).
    """
    blocks = split(nbytes, n)
    if not pairwise:
        for r in range(n):
            for k in range(1, n):
                j = (r + k) % n
                tag = f"{name}/direct"
                pair = (blocks[j], channels, tag, (), step_delay_ns, relay, channel_map, chunk, window, depth)
                _pair(b, r, j, *pair, grouped)
        return
    sent: list[list[int]] = [[] for _ in range(n)]  # sent[r]: r's flows of the previous round
    for k in range(1, n):
        tag = f"{name}/round{k}"
        new = []
        for r in range(n):
            deps = tuple(sent[r]) + tuple(sent[(r - k + 1) % n])  # r's last send and last receive
            new.append(_pair(b, r, (r + k) % n, blocks[(r + k) % n], channels, tag, deps, step_delay_ns, relay))
        sent = new


def send_recv(
    b: DagBuilder,
    nbytes: int,
    channels: int,
    step_delay_ns: int,
    name: str,
    relay: Relay | None = None,
    channel_map: ChannelMap | None = None,
    chunk: ChunkOf | None = None,
    window: int = 1,
) -> None:
    """One transfer from position 0 to position 1 (`window`: its steps in flight, see `_pair`)."""
    _pair(b, 0, 1, nbytes, channels, name, (), step_delay_ns, relay, channel_map, chunk, window)
