"""NCCL's ring through NVSwitch hosts with P2P on and one NIC per GPU (the DGX layout, across hosts): the NIC each
found channel enters and leaves a host by, and its order through the host's GPUs.

NVIDIA/nccl v2.19.4-1 to v2.30.7-1, search.cc. With NICs in the system the ring pattern runs NET -> GPU ... GPU ->
NET (`ncclTopoSearchParams`: backToNet = the last step). `ncclTopoSelectNets` lists the NICs by their GPUs' index
(each GPU's own first, `ncclTopoGetLocalNet`), and `ncclTopoSearchRecNet` starts found channel c at NIC (c + i) mod
NICs, the first with bandwidth left (`net->net.bw < bw` skips a full one): NIC c mod NICs, every NIC holding the same
number of channels. The first pass (sameChannels 1) replays channel 0's GPUs from every later NIC
(FORCED_ORDER_REPLAY), so it only reaches the NICs near GPU 0; `ncclTopoCompute` then searches with sameChannels 0,
and that graph, with more channels x bandwidth, replaces it (`ncclTopoCompareGraphs`).

`ncclTopoSearchNextGpuSort`, with an NVSwitch in the system, offers only a GPU's ring neighbours, moving the next and
then the previous to the front: from GPU e the search tries e - 1 first (e, e-1, ..., e+1: channel 0 is "0 7 6 5 4 3
2 1" in NCCL's logs) and goes the other way (e, e+1, ..., e-1) only when that fails. At the last GPU
(`ncclTopoSearchRecGpu`, step == backToNet) the ring must go back out by a NIC: crossNic 0 is tried before 2
(`ncclTopoCompute`), and `ncclTopoSearchCheckNet` (the asic / port test before 2.28) then admits only the NIC the
channel entered by, over a path within the search's typeInter, which starts at the best GPU-NIC path (PIX on the
DGX-like layout, `nvlink_pci.GPUS_PER_SWITCH` GPUs and their NICs per PCIe switch) and widens (PXB, then PXN) only
when nothing is found. So the last GPU shares the channel's NIC's switch. A ring found later at PXN (its last GPU
relaying over NVLink to the NIC: paths.cc `addInterStep`) carries no more and has more hops, so it replaces nothing;
GPUs with no switch-mate in the communicator descend (PXN).

Which GPU a later channel enters by changed in v2.28.3-1:
- v2.19.4-1 to v2.27.7-1: `ncclTopoSearchRecNet` first replays the previous channel's GPUs from the new NIC, with
  sameChannels 0 too, then tries the NIC's closest GPUs from GPU c mod GPUs on. Channel 2k runs 2k, 2k-1, ..., 2k+1
  from NIC 2k; channel 2k+1 replays it from NIC 2k+1 (on the same switch), entering GPU 2k and leaving from 2k+1.
- v2.28.3-1 to v2.30.7-1: the replay only with sameChannels 1; otherwise the NIC's own GPU (`net->net.localGpu`)
  first. Channel 2k runs 2k, 2k-1, ..., 2k+1; channel 2k+1 descends to 2k+2, off its switch, so it goes up: 2k+1,
  2k+2, ..., 2k.

connect.cc keeps these rings as found (no crossNic 2 solution to exchange), and a communicator's channel c runs
found channel c mod found (`nccl/tree_channels.chain_of`). So every hop between hosts leaves a host by its channel's
NIC and arrives at the same NIC of the next host: one NIC index (one rail) for any number of hosts. Where the last
GPU is not the NIC's, its bytes cross PCIe to the NIC, and where the entry GPU is not, they cross PCIe from it: not
simulated, the flow leaves from and arrives at the NIC's GPU, as `ring_nics` does for SHM hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phantora.collectives.nccl.nvlink_pci import GPUS_PER_SWITCH
from phantora.collectives.nccl.platform import Platform

LOCAL_GPU_FROM = (2, 28)  # v2.28.3-1: a later channel starts at its NIC's own GPU, no replay with sameChannels 0


@dataclass(frozen=True)
class HostRing:
    """One found channel's ring through a host: its GPUs by index, entry first, and the GPU whose NIC it enters
    and leaves the host by."""

    order: tuple[int, ...]
    nic: int


def applies(p: Platform) -> bool:
    """Whether the communicator's NCCL nodes are NVSwitch hosts with P2P on, one NIC per GPU, across hosts."""
    return p.nvswitch and p.nnodes > 1 and p.node_bw == 0 and p.nic_bw > 0 and p.nics_per_node == p.ppn


def switch_of(local: Sequence[int]) -> list[int]:
    """The PCIe switch of each GPU of a host, given by its index on the host (the DGX-like layout)."""
    return [k // GPUS_PER_SWITCH for k in local]


def host_order(switch: Sequence[int], entry: int, end: int | None = None) -> list[int]:
    """The ring through a host of GPUs 0..m-1 (by index; `switch[i]`: GPU i's PCIe switch) entered at `entry`: each
    GPU's previous first, unless only the ascent ends on the switch of the NIC's GPU `end` (default `entry`)."""
    m, home = len(switch), switch[entry if end is None else end]
    down = [(entry - k) % m for k in range(m)]
    up = [(entry + k) % m for k in range(m)]
    if m > 2 and switch[down[-1]] != home and switch[up[-1]] == home:
        return up
    return down


def found_rings(switch: Sequence[int], found: int, version: tuple[int, int]) -> list[HostRing]:
    """The ring through a host (GPUs by index, `switch[i]` GPU i's PCIe switch) of each of `found` channels: channel
    c on NIC c mod m, under the NCCL `version`'s search (before 2.28 a channel replays the previous one's GPUs when
    they start and end on its NIC's switch, else it starts at the NIC's first closest GPU from c mod m on)."""
    m = len(switch)
    out: list[HostRing] = []
    for c in range(found):
        nic = c % m
        prev = out[-1].order if out else None
        if version >= LOCAL_GPU_FROM:
            out.append(HostRing(tuple(host_order(switch, nic)), nic))
        elif prev is not None and switch[prev[0]] == switch[nic] == switch[prev[-1]]:
            out.append(HostRing(prev, nic))
        else:
            entry = next(g for g in ((c + i) % m for i in range(m)) if switch[g] == switch[nic])
            out.append(HostRing(tuple(host_order(switch, entry, nic)), nic))
    return out
