"""The order NCCL's ring search visits the GPUs of an NCCL node of SHM GPUs with NICs (P2P off on an NVLink host).

NVIDIA/nccl v2.19.4-1 to v2.30.7-1, search.cc: `ncclTopoSearchRecNet` enters channel 0 from the first NIC at its
first local GPU, GPU 0 (`ncclTopoGetLocal` lists GPUs by index; with an NVSwitch there is no PCI-order pass), and
`ncclTopoSearchNextGpuSort`, with an NVSwitch in the system, offers only the GPU's ring neighbours, moving the next
and then the previous to the front: the previous (index - 1) is tried first. nccl/ring_nics.py says the rest.
"""

from __future__ import annotations


def node_order(n: int) -> list[int]:
    """NCCL's ring through a node of n GPUs, by GPU index: 0 first, then each GPU's previous, 0, n-1, ..., 1."""
    return [0, *range(n - 1, 0, -1)]
