"""When a lone send that fits its connection's buffer is handed off: its sender's kernel ends there.

NCCL's send kernel (`runSend`, src/device/sendrecv.h) waits only for a free slot of its connection's NCCL_STEPS
slots, writes a step and posts it; once its last step is posted it ends, whether or not the receiver's kernel
runs. Where the slots live decides how long that takes (`sender_transport`, NCCL v2.26.5-1):

- across hosts (NET, src/transport/net.cc) the slots are the sender proxy's own buffer (GPU memory under GPU Direct
  RDMA, else pinned host memory); a p2p connection shares its proxy's buffers, so the kernel writes a step once its
  proxy has posted the slot (`sendProxyProgress` raises `sendMem->head`, which starts NCCL_STEPS behind), and the
  proxy sends it over the network later, when the receiver is ready. So the kernel's time is the launch and step
  latency, one proxy op per channel (its own direction's), and the bytes copied at its channels' copy rate; the
  network's latency, the receiving proxy's ops and the NIC's rate are not on its path;
- inside a host over NVLink with P2P read (src/transport/p2p.cc: on by default for two compute-capability 8.0
  GPUs, `ncclTopoCheckP2p`; NCCL_P2P_READ_ENABLE forces it) Simple's slots are in the sender's own memory
  (`p2pSendSetup` appends them to its ncclSendMem) and the receiver reads them across NVLink: the kernel's bytes
  do not cross the link, so its time is the latency and the copy into its own buffer. The receiver reads only
  those slots, not the user's buffer (`DirectRead` needs registered buffers, which PyTorch does not register),
  so the sender does not wait for the reader. LL and LL128 keep their slots at the receiver (P2P write);
- otherwise (P2P write over NVLink or PCIe, SHM) the kernel writes into the receiver's slots across the link:
  NCCL's p2p model of the lone transfer (`nccl.p2p.p2p_choice`: launch and step latency, the bytes at the pair's
  rate), as before.

The copy rate is NCCL's per-channel Simple figure for the GPU (`tables.NVLINK_BW_PER_LINK`, what its model gives
one channel's copy loop), times the transfer's channels, capped at the GPU's own bandwidth to its peers
(`Platform.gpu_intra_bw`, PCIe on a host without NVLink): NCCL has no figure for a copy into a local buffer, and a
channel's copy loop is the same whatever the destination.

Several such sends share their connection (`send_slots`, `SlotWindow`): NCCL splits a send over the pair's p2p
channels (`addP2pToPlan`: parts aligned to 4 KiB) and each part takes one of its channel's NCCL_STEPS slots per
chunk (the p2p chunk, a quarter or half of it for a small send across hosts, LL's half step; its 8-bit float
rounding down). A connection's slots are freed in order as the receiver consumes them, so a send hands off only
while the slots of the sends before it still unreceived and its own fit; across hosts a p2p connection's proxy
buffer is shared (NCCL_NET_SHARED_BUFFERS, on by default) and the proxy runs one send's op per channel at a time
(`ProxyAppend` chains the next one behind it), so there a send hands off only once the sends before it on its
channels are received.

On registered buffers (`PHANTORA_NCCL_REGISTER=1`, NCCL 2.24+) NCCL may move a Simple send with no copy through its
slots (`register.p2p_zero_copy`: IPC inside a node over P2P, NET across nodes without PXN; enqueue.cc
`addP2pToPlan`): the sender writes into the receiver's buffer once the receiver's kernel has posted its address
(prims_simple.h `setDataPtrs`, the send side waits on `ptrExchange`), reads from its own only as the receiver pulls
(P2P read: the send waits for the reader), or waits for its proxy to have sent the data (NET). Such a send has no
slots to hand off into (`Slots.zero_copy`): it ends with its transfer, which starts when its receiver is posted.
Whether PXN is in use is the communicator's (`comm`: the group's under eager init, else the pair's own).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from phantora.collectives.nccl import choose, settings
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.chunking import comm_p2p_chunk, step_bytes
from phantora.collectives.nccl.platform import Platform, platform_of
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import Choice, net_overhead_us
from phantora.collectives.slot_window import Slots
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology

WIRE_FACTOR = {"Simple": 1.0, "LL": 2.0, "LL128": 128 / 120}  # bytes a protocol writes per byte sent (flags)


def sender_transport(p: Platform, st: NcclSettings) -> str:
    """Where a lone send's kernel writes its steps: "net" (its proxy's buffer, across hosts), "p2p_read" (its own
    buffer, which the receiver reads over NVLink) or "p2p_write" (the receiver's buffer, across the link)."""
    if p.nnodes > 1:
        return "net"
    read = p.intra == "nvlink" and p.compcap == 80  # ncclTopoCheckP2p: Ampere (8.0) pairs over NVLink
    forced = dict(st.raw).get("NCCL_P2P_READ_ENABLE", "").strip()
    if forced and forced.lstrip("-").isdigit():
        read = p.intra == "nvlink" and int(forced) != 0
    return "p2p_read" if read else "p2p_write"


def _options(algo: AlgoOptions, over: Mapping[str, Any]) -> AlgoOptions:
    keep = {k: v for k, v in over.items() if k not in ("traffic_class", "loss_tolerance")}
    return dataclasses.replace(algo, **keep) if keep else algo


def _lone_send(
    topo: Topology,
    algo: AlgoOptions,
    over: Mapping[str, Any],
    src: int,
    dst: int,
    nbytes: int,
    comm: tuple[int, ...] = (),
) -> tuple[Choice, NcclSettings, Platform] | None:
    """NCCL's choice for a lone send of `nbytes` from `src` to `dst` on the communicator `comm` (its global ranks;
    (): the pair's own), with the settings and platform it was made under; None where NCCL's model does not time
    it (the ideal model)."""
    opts = _options(algo, over)
    on = tuple(comm) if comm and set(comm) != {src, dst} else ()
    choice = choose(Collective("send_recv", (src, dst), nbytes, "uint8", comm=on), topo, opts)
    if choice is None:
        return None
    st = settings(opts)
    return choice, st, platform_of(topo, (src, dst), st)


def handoff_ns(
    topo: Topology,
    algo: AlgoOptions,
    over: Mapping[str, Any],
    src: int,
    dst: int,
    nbytes: int,
    comm: tuple[int, ...] = (),
) -> int | None:
    """The ns from a lone send's kernel start to its hand-off (`src` to `dst`, `nbytes`, on communicator `comm`), under
    the run's `algo` with a call's overrides `over` (its NCCL_* variables); None where NCCL's model does not time it
    (the ideal model)."""
    lone = _lone_send(topo, algo, over, src, dst, nbytes, comm)
    if lone is None:
        return None
    choice, st, p = lone
    how = sender_transport(p, st)
    if choice.algorithm != "p2p" or how == "p2p_write" or (how == "p2p_read" and choice.protocol != "Simple"):
        return round(choice.time_us * 1000.0)
    lat_us = T.BASE_LAT["ring"][T.PROTOCOLS.index(choice.protocol)]
    if how == "net":  # the sending proxy posts each channel's slots; the receiving proxy's op is not on the path
        lat_us += choice.channels * net_overhead_us(p, st)
    copy = min(p.gpu_intra_bw, choice.channels * T.NVLINK_BW_PER_LINK[p.arch])  # GB/s: bytes per ns
    return round(lat_us * 1000.0 + nbytes * WIRE_FACTOR[choice.protocol] / copy)


def fp8_floor(x: int) -> int:
    """`x` as NCCL stores a p2p chunk (u32fp8Encode then Decode, src/include/bitops.h): its leading bit and the
    three below it, the rest dropped."""
    if x < 16:
        return x
    drop = x.bit_length() - 4
    return x >> drop << drop


def part_bytes(nbytes: int, parts: int) -> list[int]:
    """The bytes of each of a transfer's `parts` (ncclP2pPartBounds: ceil(nbytes / parts) rounded up to 4 KiB)."""
    size = -(-math.ceil(nbytes / parts) // 4096) * 4096 if parts else 0
    return [max(0, min((i + 1) * size, nbytes) - min(i * size, nbytes)) for i in range(parts)]


def send_slots(
    topo: Topology,
    algo: AlgoOptions,
    over: Mapping[str, Any],
    src: int,
    dst: int,
    nbytes: int,
    comm: tuple[int, ...] = (),
) -> Slots | None:
    """The slots a lone send of `nbytes` from `src` to `dst` (on communicator `comm`) takes on each of its channels
    (`addP2pToPlan`, NCCL v2.26.5-1: a chunk per step, one step for an empty send), `zero_copy` where NCCL moves it
    between registered buffers (the choice's `registered`: it takes no slot and waits for its receiver); None where
    NCCL's model does not time it."""
    lone = _lone_send(topo, algo, over, src, dst, nbytes, comm)
    if lone is None:
        return None
    choice, st, p = lone
    network = p.nnodes > 1
    step = comm_p2p_chunk(p, st) if choice.protocol == "Simple" else step_bytes(choice.protocol, st)
    chunk = step
    if network and choice.protocol == "Simple" and nbytes < step:
        chunk //= 4
    elif network and nbytes < 8 * step:
        chunk //= 2
    data = fp8_floor(max(1, chunk // 2 if choice.protocol == "LL" else chunk))
    steps = (1,) if nbytes == 0 else tuple(-(-b // data) for b in part_bytes(nbytes, max(1, choice.channels)))
    shared = dict(st.raw).get("NCCL_NET_SHARED_BUFFERS", "").strip()
    one_op = network and not (shared.lstrip("-").isdigit() and int(shared) == 0)
    return Slots(steps, one_op, zero_copy=choice.registered and nbytes > 0, back_ns=slot_back_ns(topo, src, dst))


def slot_back_ns(topo: Topology, src: int, dst: int) -> int:
    """The ns from the end of a send's flows from rank `src` to rank `dst` until its sender sees the slots they
    held free: the propagation of the path from dst back to src. Inside a host the receiver's kernel stores the
    connection's head into the sender's memory across the link (a flag, `back_pressure.credit_latency`); across
    hosts the sending proxy frees its slots as its isends complete (net.cc `sendProxyProgress`: `done` once
    `ncclNet->test` says so), when each write's ACK is back from the receiver (`back_pressure.Credits.acked`)."""
    a, z = topo.node_of_rank(dst), topo.node_of_rank(src)
    return topo.path_latency_ns(topo.route(a, z)) if a != z else 0
