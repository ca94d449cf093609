"""How NCCL 2.22+ splits one collective's count over its channels (enqueue.cc `scheduleCollTasksToPlan`).

From v2.22.3-1 each channel gets one contiguous part of the buffer (`ncclCollCbdPart`, device.h) and its own chunk
(`calcCollChunking` called per part with nChannels = 1 and the part's global bytes: the part's count times the
element size, times nranks for all-gather and reduce-scatter). The parts are whole cells, dealt by traffic (bytes
x 2 for all-reduce, x nranks for all-gather and reduce-scatter, x 1 else): each channel is given
trafficPerChannel = traffic / channels, the first ("lo") part its cells up to that budget, the "mid" parts
cellsPerChannel = ceil(budget / traffic per cell) each, the last ("hi") part what is left; a split that would need
more channels than the communicator has puts the rest on its last one. The count's excess over whole cells comes
off the last part. What changed between versions (the tags read):

- v2.22.3-1: 16-byte cells; the budget at least 512 B of traffic; the lo part floor(budget / traffic per cell).
- v2.23.4-1 to v2.28: a cell carries 16 KiB of traffic (16 KiB / traffic per byte, rounded up to 16 B: 8 KiB
  of an all-reduce); a collective counts as at least 16 KiB of traffic; the lo part rounds up.
- v2.26.2-1 on: LL counts 4 x the traffic (its lines carry half data, and it is slower), so its cells are 4 x
  smaller.
- v2.29.2-1 on: 32 KiB of traffic per cell and at least; the budget is rounded up to 16 B instead.

Before 2.22 (`computeColl*` in enqueue.cc) every channel strides the whole buffer and the chunk is sized from the
collective's total bytes over its channels: `split` returns None there.
"""

from __future__ import annotations

SPLIT_FROM = (2, 22)  # v2.22.3-1: one contiguous part per channel, chunked per part
CELL_TRAFFIC_FROM = (2, 23)  # v2.23.4-1: cells of MinTrafficPerChannel traffic, lo part rounded up
LL_TRAFFIC_X4_FROM = (2, 26)  # v2.26.2-1: LL's traffic counted 4 x
BUDGET_ROUNDED_FROM = (2, 29)  # v2.29.2-1: 32 KiB minimum, budget rounded up to 16 B


def traffic_per_byte(kind: str, nranks: int) -> int:
    """ncclFuncTrafficPerByte: 2 for all-reduce, nranks for all-gather and reduce-scatter, else 1."""
    if kind == "all_reduce":
        return 2
    return nranks if kind in ("all_gather", "reduce_scatter") else 1


def global_per_count_byte(kind: str, nranks: int) -> int:
    """ncclFuncMaxSendRecvCount per unit count: the bytes `calcCollChunking` sees per byte of a part's count."""
    return nranks if kind in ("all_gather", "reduce_scatter") else 1


def count_bytes(kind: str, nranks: int, nbytes: int) -> int:
    """The bytes of NCCL's `count` for a collective of nccl-tests' size `nbytes` (all-gather's output and
    reduce-scatter's input are nranks counts)."""
    return nbytes // global_per_count_byte(kind, nranks)


def _min_traffic(version: tuple[int, int]) -> int:
    if version < CELL_TRAFFIC_FROM:
        return 512
    return 32 * 1024 if version >= BUDGET_ROUNDED_FROM else 16 * 1024


def div_up(a: int, b: int) -> int:
    """NCCL's DIVUP: a / b rounded up."""
    return -(-a // b)


def split(
    version: tuple[int, int], kind: str, proto: str, nranks: int, count: int, channels: int, max_channels: int = 0
) -> tuple[int, ...] | None:
    """Each channel's part (bytes of the count, lo first) of a collective alone in its plan, `count` bytes, whose
    algorithm runs `channels` (the task's nMaxChannels) of the communicator's `max_channels` (0: the same); None
    before NCCL 2.22."""
    if version < SPLIT_FROM:
        return None
    if count <= 0:
        return (0,)
    nmax = max(1, max_channels or channels)
    nch = max(1, min(channels, nmax))
    per_byte = traffic_per_byte(kind, nranks)
    if proto == "LL" and version >= LL_TRAFFIC_X4_FROM:
        per_byte *= 4
    least = _min_traffic(version)
    traffic = count * per_byte
    if version < CELL_TRAFFIC_FROM:
        cell = 16
        budget = max(least, traffic // nch)
    else:
        cell = div_up(div_up(least, per_byte), 16) * 16
        traffic = max(least, traffic)
        budget = div_up(traffic // nch, 16) * 16 if version >= BUDGET_ROUNDED_FROM else max(least, traffic // nch)
    cells = div_up(count, cell)
    per_cell = cell * per_byte
    per_channel = min(cells, div_up(budget, per_cell))
    if nmax == 1:
        lo = cells
    else:
        lo = min(cells, budget // per_cell if version < CELL_TRAFFIC_FROM else div_up(budget, per_cell))
    n_mid = (cells - lo) // per_channel
    hi = (cells - lo) % per_channel
    if nmax < (1 if lo else 0) + n_mid + (1 if hi else 0):  # overflow: the rest on the last channel
        n_mid = nmax - 2
        per_channel = (cells - lo) // (n_mid + 1)
        hi = per_channel + (cells - lo) % (n_mid + 1)
    if hi == 0 and n_mid != 0:
        hi, n_mid = per_channel, n_mid - 1
    if lo == 0:
        if n_mid == 0:
            lo, hi = hi, 0
        else:
            lo, n_mid = per_channel, n_mid - 1
    parts = [lo * cell] + [per_channel * cell] * n_mid + ([hi * cell] if hi else [])
    parts[-1 if hi else 0] -= cells * cell - count  # the excess over the count off hi, else lo
    return tuple(p for p in parts if p > 0) or (0,)


def busiest(
    version: tuple[int, int], kind: str, proto: str, nranks: int, nbytes: int, channels: int, max_channels: int = 0
) -> tuple[int, int] | None:
    """(the busiest channel's global bytes, as `calcCollChunking` sees them; the channels used) for a collective
    of nccl-tests' size `nbytes`; None before NCCL 2.22."""
    parts = split(version, kind, proto, nranks, count_bytes(kind, nranks, nbytes), channels, max_channels)
    if parts is None:
        return None
    return max(parts) * global_per_count_byte(kind, nranks), len(parts)
