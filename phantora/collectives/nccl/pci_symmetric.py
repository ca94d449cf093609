"""Whether NCCL gives one host's GPUs without a direct NVLink between every pair symmetric support (the symmetric
kernels of `-R 2` and, from 2.28, the copy-engine collectives run only with it).

NCCL 2.27.x - 2.28.3 (init.cc): `symmetricSupport = isAllDirectP2p && nNodes == 1 && NCCL_WIN_ENABLE && cuMem`,
`isAllDirectP2p` from `ncclTransportCheckP2pType` (transport.cc): every pair of the node's GPUs connects by P2P at
NCCL's own P2P level (`ncclTopoCheckP2p`, no intermediate GPU). On a PCIe host (`pci_paths.py`) that is every pair's
path within the level (PXB by default: GPUs under one switch; `NCCL_P2P_LEVEL` / `NCCL_P2P_DISABLE` move it); one
pair on SHM and NCCL runs its legacy algorithms. From 2.28.7 it is `isAllCudaP2p`, CUDA's raw peer capability
"irrespective of the distance" (cudaDeviceCanAccessPeer), which depends on the platform's PCIe and IOMMU set-up and
which a topology does not state: refused. NVLink hosts where some pairs are not linked directly are refused too
(whether their P2P takes an intermediate GPU is not modelled).
"""

from __future__ import annotations

from phantora.collectives.nccl import pci_paths
from phantora.collectives.nccl.old_tuners import NEWEST_PATCH
from phantora.collectives.nccl.platform import Platform
from phantora.errors import InputError

CUDA_P2P_FROM = (2, 28, 7)  # symmetricSupport from isAllCudaP2p


def release_text(rel: tuple[int, int, int]) -> str:
    """A release as its name: 2.28.7, or 2.30 for a minor named alone (its newest patch)."""
    return f"{rel[0]}.{rel[1]}" if rel[2] == NEWEST_PATCH else f"{rel[0]}.{rel[1]}.{rel[2]}"


def all_direct_p2p(p: Platform) -> bool:
    """`isAllDirectP2p` on a described PCIe host: every ordered pair's path within NCCL's P2P level."""
    h = p.pci
    assert h is not None
    return all(pci_paths.path_type(h, i, j) <= pci_paths.p2p_level(h) for i, j in pci_paths.all_pairs(h))


def pci_symmetric_support(p: Platform, rel: tuple[int, int, int], what: str) -> bool:
    """Whether NCCL `rel` gives this one-host communicator of GPUs without a direct NVLink between every pair
    symmetric support; raises (naming `what`, the call) where that is not decidable from the topology."""
    if p.pci is None:
        raise InputError(
            f"symmetric registration (-R 2) of {what} on NVLink GPUs without a direct link between every pair: "
            "whether NCCL's P2P between them takes an intermediate GPU (no symmetric support) is not modelled",
            field="PHANTORA_NCCL_REGISTER",
        )
    if rel >= CUDA_P2P_FROM:
        raise InputError(
            f"symmetric registration (-R 2) of {what} on a PCIe host: NCCL {release_text(rel)} gives it "
            "symmetric support by CUDA's peer capability (isAllCudaP2p), which the topology does not state; "
            "2.27 - 2.28.3 decide by NCCL's P2P level, which is modelled",
            field="PHANTORA_NCCL_VERSION",
        )
    return all_direct_p2p(p)
