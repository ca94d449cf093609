"""nccl-tests' -M line, "# GPU memory usage : Initialization X | User-Allocated Y | Collective Z | Total  T".

nccl-tests measures the three by cudaMemGetInfo before and after each phase (src/common.cu): Initialization is what
the NCCL communicators take, User-Allocated its own buffers (AllocateBuffs), Collective what the run adds. phantora
computes User-Allocated as nccl-tests allocates it: a send and a receive buffer of maxBytes + 8 x unalign each, and
with -c (validation) an expected buffer of the test's receive size at maxBytes (its GetBuffSize), each through
ncclMemAlloc, which rounds to the allocation granularity CUDA recommends (2 MiB on the data-centre GPUs phantora
knows). NCCL's own memory is not modelled: the other two figures and the total print N/A.
"""

from __future__ import annotations

GRANULARITY = 2 << 20  # cuMemGetAllocationGranularity(RECOMMENDED) on H100 / A100 (2 MiB)
NOT_MODELLED = "N/A"


def recv_bytes(layout: str, kind: str, maxbytes: int, nranks: int) -> int:
    """The receive buffer nccl-tests' GetBuffSize gives for maxBytes (its counts in bytes: element size 1)."""
    if layout == "full":
        return maxbytes
    base = (maxbytes // nranks) & ~15
    return base if kind in ("reduce_scatter", "scatter") else base * nranks


def allocated(size: int) -> int:
    """What one ncclMemAlloc of `size` bytes takes: rounded up to the granularity (nothing for 0)."""
    return -(-size // GRANULARITY) * GRANULARITY


def user_allocated(layout: str, kind: str, maxbytes: int, nranks: int, unalign: int, check: int) -> int:
    """One GPU's buffers, as AllocateBuffs allocates them."""
    data = allocated(maxbytes + 8 * unalign)
    return 2 * data + (allocated(recv_bytes(layout, kind, maxbytes, nranks)) if check else 0)


def mem_string(amount: int) -> str:
    """util.cu's getMemString: GB / MB / KB / B in powers of 1024, 2 decimals below 10, 1 below 100, else none."""
    value, unit = float(amount), " B"
    for scale, name in ((1 << 30, " GB"), (1 << 20, " MB"), (1 << 10, " KB")):
        if abs(value) >= scale:
            value, unit = value / scale, name
            break
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f}{unit}"


def memory_line(user_bytes: int) -> str:
    """The -M line as util.cu's writeMemInfo prints it, NCCL's own figures N/A."""
    parts = [("Initialization", NOT_MODELLED), ("User-Allocated", mem_string(user_bytes)), ("Collective", NOT_MODELLED)]
    body = "| ".join(f"{name} {value} " for name, value in parts)
    return f"# {'GPU memory usage':<20s} : {body}| Total  {NOT_MODELLED}"
