"""Host memory a process takes, for the run summary and the scale benchmarks."""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # bytes: glibc's own starting threshold, kept fixed


def proportional_set_mb(pid: int | str = "self") -> float | None:
    """A process's proportional set size now (Linux; None elsewhere or if it is gone), in MB.

    Unlike RSS it splits shared pages among the processes sharing them, so summed over ranks forked
    by the fork server it is the host memory they really take."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The host memory the kernel could give processes now without swapping (`MemAvailable`); None if not told."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def return_freed_memory() -> bool:
    """Have glibc give every block of `MMAP_THRESHOLD` bytes or more (a tensor's data) its own mapping, unmapped
    when freed: a real-mode rank then holds what its tensors hold. By default glibc raises that threshold to the
    size of each such block freed (up to 32 MiB) and then serves those sizes from its heap, which keeps freed memory
    (torchtitan's debug model at sequence 512: 799-820 MiB a rank at its peak against 745 with the threshold fixed,
    docs/runtime.md). Fixing it (mallopt M_MMAP_THRESHOLD) turns that raise off. False where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


def heap_in_use_bytes() -> int | None:
    """Bytes this process holds from malloc now (glibc's mallinfo2: blocks in use plus mapped blocks): what C++
    objects and Python's larger ones take, without the pages freed but kept; None without glibc 2.33."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)
