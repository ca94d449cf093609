"""How far published nccl-tests tables of the same machine and settings disagree with each other, size by size.

Two clusters of the same GPUs, host count, NIC rate, hosts' CPU and NCCL settings run the same NCCL model; where
their published bus bandwidths differ by more than the goal's band, no model of NCCL can meet the goal on both.
A prediction v is within `tol` of a published p when p (1 - tol) <= v <= p (1 + tol); for every table of a group
at once the band is [max p x (1 - tol), min p x (1 + tol)], empty when max p / min p > (1 + tol) / (1 - tol)
(15%: 1.353; 10% from 64 MiB: 1.222).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from phantora.collectives.nccl.cpu_vendor import vendor_named
from phantora.collectives.nccl.published import Table

BIG = 64 << 20  # the goal is 15% below this size, 10% from it


def tolerance(size: int) -> float:
    """The issue's goal at `size` bytes: 15% below 64 MiB, 10% from 64 MiB up."""
    return 0.10 if size >= BIG else 0.15


def machine_key(t: Table) -> tuple[object, ...]:
    """What makes two tables the same experiment: GPU, GPUs, hosts, collective, NCCL_ALGO and the other NCCL
    variables phantora honours (the NCCL version to its minor: a table may state its patch, another not), NIC rate,
    GPUs per launching thread (-g) and the hosts' CPU vendor."""
    cpu = vendor_named(t.cpu, file=str(t.path)) or "intel"
    forced = tuple((k, ".".join(v.split(".")[:2]) if k == "PHANTORA_NCCL_VERSION" else v) for k, v in t.forced)
    return (t.gpu, t.gpus, t.nodes, t.test, t.nccl_algo, forced, t.nic_gbps, t.gpus_per_thread, cpu)


def groups(tables: Iterable[Table]) -> list[list[Table]]:
    """Tables of the same experiment (`machine_key`), two or more to a group, in name order."""
    by_key: dict[tuple[object, ...], list[Table]] = {}
    for t in sorted(tables, key=lambda t: t.name):
        by_key.setdefault(machine_key(t), []).append(t)
    return [g for g in by_key.values() if len(g) > 1]


@dataclass(frozen=True)
class Spread:
    """The published bus bandwidths (GB/s) of one size across a group's tables, and the goal's band there."""

    size: int
    published: tuple[float, ...]  # one per table, in the group's order

    @property
    def ratio(self) -> float:
        """Largest over smallest published figure."""
        return max(self.published) / min(self.published)

    @property
    def band(self) -> tuple[float, float]:
        """The predictions within the goal of every table: (low, high); low > high when there is none."""
        tol = tolerance(self.size)
        return max(self.published) * (1 - tol), min(self.published) * (1 + tol)

    @property
    def reachable(self) -> bool:
        """Whether one prediction can meet the goal on every table (ratio <= (1 + tol) / (1 - tol))."""
        low, high = self.band
        return low <= high


def spreads(group: Sequence[Table]) -> list[Spread]:
    """Every size that all tables of `group` publish (a positive figure), smallest first."""
    figures = [{size: bw for size, bw in t.rows if bw > 0} for t in group]
    common = sorted(set.intersection(*(set(f) for f in figures)))
    return [Spread(size, tuple(f[size] for f in figures)) for size in common]


@dataclass(frozen=True)
class Fit:
    """A table's times over a span of sizes as t = a + S x f / B (f: bus over algorithm bandwidth, e.g.
    2 (n - 1) / n for an all-reduce): the fixed cost a (µs) and the marginal bus bandwidth B (GB/s), least squares
    over the span's `points` sizes from `lo` to `hi` bytes. B is infinite where time does not grow with size."""

    lo: int
    hi: int
    points: int
    intercept_us: float
    busbw: float


def time_us(size: int, busbw: float, factor: float) -> float:
    """nccl-tests' time (µs) of `size` bytes at `busbw` GB/s: size x factor / busbw."""
    return size * factor / (busbw * 1000.0)


def fit(rows: Sequence[tuple[int, float]], factor: float) -> Fit:
    """The least-squares `Fit` of (size, busbw GB/s) rows whose bus over algorithm bandwidth is `factor`."""
    pts = [(size * factor, time_us(size, bw, factor)) for size, bw in rows if bw > 0]
    if len({x for x, _ in pts}) < 2:
        raise ValueError(f"spread.fit: {len(pts)} usable row(s); two sizes with a positive busbw are needed")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)  # µs per bus byte
    busbw = 1.0 / (1000.0 * slope) if slope > 0 else float("inf")
    sizes = [size for size, bw in rows if bw > 0]
    return Fit(min(sizes), max(sizes), len(pts), my - slope * mx, busbw)


def runs(labels: Sequence[str], shortest: int = 3) -> list[tuple[int, int]]:
    """Index ranges [start, end) of consecutive equal labels at least `shortest` long (the sizes one algorithm
    runs, in size order)."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            if i - start >= shortest:
                out.append((start, i))
            start = i
    return out
