"""NCCL's symmetric kernels (`-R 2`, `nccl/sym_kernels.py`) as flows: the bytes each GPU's NVLink carries as the
kernel moves them, inside one NVLink domain.

The unicast kernels reach every peer's buffer directly (loads and stores through the symmetric window), so they
are a mesh, one flow per ordered pair: all-reduce `AGxLL_R` sends the whole buffer S to every peer (LL lines, so
2S on the wire: `shape.wire_bytes`) and reduces locally; `RSxLD_AGxST` loads each peer's part of its slice and
stores its reduced slice to every peer, 2S/n a pair; all-gather `LL` / `ST` store a rank's part s = S/n to every
peer; reduce-scatter `LL` / `LD` move each peer's part of a slice, s a pair. Each GPU then carries (n - 1) pairs
each way. The multicast kernels (NVLS) go through the switch: a GPU stores or load-reduces once and the switch
replicates or reduces, so, as `nvls.py` writes NVLS, they are n flows GPU i -> i + 1 carrying the bounding
direction's bytes: `RSxLDMC_AGxSTMC` S (n + 1) / n, `AGxLLMC_R` (n - 1) S (received), all-gather `LLMC` / `STMC`
and reduce-scatter `LDMC` (n - 1) s.
"""

from __future__ import annotations

from phantora.collectives.dag import DagBuilder

MULTICAST = ("AllReduce_AGxLLMC_R", "AllReduce_RSxLDMC_AGxSTMC", "AllGather_LLMC", "AllGather_STMC")
MULTICAST_RS = ("ReduceScatter_LDMC",)


def pair_bytes(kind: str, kernel: str, nbytes: int, n: int) -> int:
    """Payload bytes of one flow of `kernel` (a mesh pair, or a multicast kernel's GPU i -> i + 1 flow), for a
    collective of `nbytes` (phantora's size: all-gather's output, reduce-scatter's input) over `n` GPUs."""
    part = nbytes if kind == "all_reduce" else -(-nbytes // n)
    if kernel == "AllReduce_RSxLDMC_AGxSTMC":
        return -(-nbytes * (n + 1) // n)
    if kernel in MULTICAST or kernel in MULTICAST_RS:
        return (n - 1) * part
    if kernel == "AllReduce_RSxLD_AGxST":
        return -(-2 * nbytes // n)
    return part


def sym_flows(b: DagBuilder, kind: str, kernel: str, n: int, nbytes: int) -> None:
    """The flows of symmetric kernel `kernel` over group positions 0..n-1 (one NVLink domain)."""
    size = pair_bytes(kind, kernel, nbytes, n)
    tag = f"sym/{kernel}"
    if kernel in MULTICAST or kernel in MULTICAST_RS:
        for i in range(n):
            b.add(i, (i + 1) % n, size, tag, 0)
        return
    for i in range(n):
        for j in range(n):
            if i != j:
                b.add(i, j, size, tag, 0)
