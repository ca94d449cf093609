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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from phantora.collectives.nccl import choose, settings
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform, platform_of
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import net_overhead_us
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


def handoff_ns(
    topo: Topology, algo: AlgoOptions, over: Mapping[str, Any], src: int, dst: int, nbytes: int
) -> int | None:
    """The ns from a lone send's kernel start to its hand-off (`src` to `dst`, `nbytes`), under the run's `algo` with
    a call's overrides `over` (its NCCL_* variables); None where NCCL's model does not time it (the ideal model)."""
    keep = {k: v for k, v in over.items() if k not in ("traffic_class", "loss_tolerance")}
    opts = dataclasses.replace(algo, **keep) if keep else algo
    choice = choose(Collective("send_recv", (src, dst), nbytes, "uint8"), topo, opts)
    if choice is None:
        return None
    st = settings(opts)
    p = platform_of(topo, (src, dst), st)
    how = sender_transport(p, st)
    if choice.algorithm != "p2p" or how == "p2p_write" or (how == "p2p_read" and choice.protocol != "Simple"):
        return round(choice.time_us * 1000.0)
    lat_us = T.BASE_LAT["ring"][T.PROTOCOLS.index(choice.protocol)]
    if how == "net":  # the sending proxy posts each channel's slots; the receiving proxy's op is not on the path
        lat_us += choice.channels * net_overhead_us(p, st)
    copy = min(p.gpu_intra_bw, choice.channels * T.NVLINK_BW_PER_LINK[p.arch])  # GB/s: bytes per ns
    return round(lat_us * 1000.0 + nbytes * WIRE_FACTOR[choice.protocol] / copy)
