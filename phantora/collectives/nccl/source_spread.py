"""How far published nccl-tests tables of the same set-up disagree with each other, and which of the model's misses
lie inside that disagreement (bench/bench_nccl_source_spread.py).

Two tables are of **the same set-up** when they agree on everything in `setup_key` (GPU, GPUs, hosts, fabric
class, collective, and the NCCL variables that pick the algorithm, protocol, channels or transport) and their NCCL
versions are near (`near_versions`: the same major and at most `NEAR_MINORS` minor releases apart, or one of them
unstated). What the set-up does not hold equal is listed pair by pair (`differences`): the NCCL version, nccl-tests'
-g, -w, -n and -G, the column (in-place or out-of-place), the data type, the host model and its GPU memory, the
network's link layer (InfiniBand or RoCE) and the hosts' CPU, as each CSV's first line states them.

Where two tables of one set-up publish the same size, a prediction meets the goal on both only inside
[max x (1 - tol), min x (1 + tol)] (`spread.Spread`); a miss of the model at a size where that band is empty for
some partner is inside the source-to-source spread: no model can meet both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from phantora.collectives.nccl.published import _ITERS, Table
from phantora.collectives.nccl.spread import Spread, tolerance

NEAR_MINORS = 2  # NCCL releases at most this many minor versions apart count as near (2.17 and 2.18, not 2.26)
_VERSION = "PHANTORA_NCCL_VERSION"
_NVLS_CAPABLE = ("h100", "h200", "b200")  # NVSwitch hosts whose NCCL enables NVLS by default (NCCL_NVLS_ENABLE=2)
_NO_NVLS = ("alltoall", "sendrecv")  # tests NVLS serves in no NCCL version: NCCL_NVLS_ENABLE does not change them


def _head(t: Table) -> str:
    return _first_line(str(t.path))


@cache
def _first_line(path: str) -> str:
    with open(path) as f:
        return f.readline()


def fabric(t: Table) -> str:
    """The fabric class: NVSwitch inside one host, else the NIC rate per GPU across hosts (RDMA)."""
    return "nvswitch" if t.nodes == 1 else f"{t.nic_gbps}G per GPU"


def settings(t: Table) -> tuple[tuple[str, str], ...]:
    """The NCCL variables a table forces that phantora honours, NCCL_ALGO included, values upper-cased, without
    the version; NCCL_NVLS_ENABLE=1 is dropped where it is NCCL's default (an NVSwitch host of H100/H200/B200), and
    NCCL_NVLS_ENABLE is dropped for all-to-all and sendrecv (no NVLS path)."""
    env = {k: v.upper() for k, v in t.env.items() if k != _VERSION}
    if (env.get("NCCL_NVLS_ENABLE") == "1" and t.gpu in _NVLS_CAPABLE) or t.test in _NO_NVLS:
        env.pop("NCCL_NVLS_ENABLE", None)
    return tuple(sorted(env.items()))


def setup_key(t: Table) -> tuple[object, ...]:
    """What two tables of the same set-up share (the version apart: `near_versions`)."""
    return (t.gpu, t.gpus, t.nodes, fabric(t), t.test, settings(t))


@dataclass(frozen=True)
class Version:
    """A table's NCCL version: how it is known ("stated", "inferred" from the run, or "unstated") and its text."""

    how: str
    text: str = ""

    @property
    def minor(self) -> tuple[int, int] | None:
        if not self.text:
            return None
        major, minor = self.text.split(".")[:2]
        return int(major), int(minor)

    def __str__(self) -> str:
        return {"stated": self.text, "inferred": f"{self.text} (inferred)"}.get(self.how, "unstated")


def version(t: Table) -> Version:
    """The NCCL version of the first line's nccl=..., else the one published.NCCL_INFERRED takes for the run."""
    stated = re.search(r"nccl=(\d+\.\d+(?:\.\d+)?)", _head(t))
    if stated:
        return Version("stated", stated.group(1))
    inferred = dict(t.forced).get(_VERSION)
    return Version("inferred", inferred) if inferred else Version("unstated")


def near_versions(a: Version, b: Version, minors: int = NEAR_MINORS) -> bool:
    """The same major and at most `minors` minor releases apart; an unstated version is near any."""
    x, y = a.minor, b.minor
    return x is None or y is None or (x[0] == y[0] and abs(x[1] - y[1]) <= minors)


def same_setup(a: Table, b: Table, minors: int = NEAR_MINORS) -> bool:
    """Two different tables of the same set-up (`setup_key` equal, versions at most `minors` apart)."""
    return a.name != b.name and setup_key(a) == setup_key(b) and near_versions(version(a), version(b), minors)


def partners(t: Table, pool: Sequence[Table], minors: int = NEAR_MINORS) -> list[Table]:
    """The other tables of `pool` of `t`'s set-up, in name order."""
    return sorted((p for p in pool if same_setup(t, p, minors)), key=lambda p: p.name)


def _find(patterns: Sequence[str], text: str, flags: int = 0) -> str:
    for pattern in patterns:
        m = re.search(pattern, text, flags=flags)
        if m:
            return m.group(1).lower()
    return "unstated"


def run_facts(t: Table) -> dict[str, str]:
    """What the set-up does not hold equal, as the first line states it ("unstated" where it does not)."""
    head = _head(t)
    system = re.search(r"system=([^;]*)", head)
    host = system.group(1) if system else ""
    fabric_type = "n/a (one host)"
    if t.nodes > 1:
        nic = re.search(r"nic=([^;]*)", head)
        text = nic.group(1) if nic else ""
        infiniband = re.search(r"infiniband|\bIB\b", text, re.IGNORECASE)
        fabric_type = "roce" if "roce" in text.lower() else "infiniband" if infiniband else "unstated"
    return {
        "nccl": str(version(t)),
        "-g": str(t.gpus_per_thread),
        "-w": _find((r"-w\s*(\d+)\b", r"--warmup_iters\s+(\d+)", r"warmup\s+(\d+)"), head),
        "-n": str(t.iters) if any(re.search(p, head) for p in _ITERS) else "unstated",
        "-G": _find((r"(?<![-\w])-G\s*(\d+)",), head),
        "column": _find((r"\b(in-place|out-of-place)\s+(?:column|numbers)",), head, re.IGNORECASE),
        "dtype": _find((r"--datatype\s+(\w+)", r"\b(float)\s+sum"), head),
        "host": re.split(r"[(,;]", host)[0].strip() or "unstated",
        "gpu memory": _find((r"(\d+)\s?GB\b",), host),
        "link layer": fabric_type,
        "cpu": t.cpu or "unstated",
    }


def differences(a: Table, b: Table) -> list[str]:
    """Each fact of `run_facts` on which two tables differ (or which one of them leaves unstated), as
    "name a / b", then the facts both leave unstated."""
    fa, fb = run_facts(a), run_facts(b)
    out = [f"{k} {fa[k]} / {fb[k]}" for k in fa if fa[k] != fb[k]]
    both = [k for k in fa if fa[k] == fb[k] == "unstated"]
    return out + ([f"unstated in both: {', '.join(both)}"] if both else [])


@dataclass(frozen=True)
class Gap:
    """One size two tables of a set-up both publish: their busbw (GB/s) and whether one prediction meets both."""

    size: int
    a: float
    b: float

    @property
    def ratio(self) -> float:
        """Larger over smaller."""
        return max(self.a, self.b) / min(self.a, self.b)

    @property
    def apart(self) -> float:
        """(b - a) / a: how far b lies from a, as the model's error is counted."""
        return (self.b - self.a) / self.a

    @property
    def floor(self) -> float:
        """The least worst error any one prediction v can have on both: max(|v - a| / a, |v - b| / b) is smallest
        at v = 2ab / (a + b), where it is |b - a| / (a + b)."""
        return abs(self.b - self.a) / (self.a + self.b)

    @property
    def reachable(self) -> bool:
        return Spread(self.size, (self.a, self.b)).reachable


def gaps(a: Table, b: Table, min_size: int = 0) -> list[Gap]:
    """Every size from `min_size` both tables publish with a positive busbw, smallest first."""
    fb = {size: bw for size, bw in b.rows if bw > 0}
    return [Gap(size, bw, fb[size]) for size, bw in a.rows if bw > 0 and size in fb and size >= min_size]


def meets(prediction: float, published: float, size: int) -> bool:
    """Whether a prediction is within the goal of a published figure at `size`."""
    return abs(prediction - published) <= tolerance(size) * published


@dataclass(frozen=True)
class MissVerdict:
    """One size the model misses on a table, against the table's partners: "inside" (some partner's figure and
    this table's leave no prediction within the goal of both), "outside" (every partner's figure at this size
    leaves one), or "no partner figure" (no partner publishes this size)."""

    size: int
    published: float
    model: float
    partner_figures: tuple[tuple[str, float], ...]

    @property
    def verdict(self) -> str:
        if not self.partner_figures:
            return "no partner figure"
        reachable = all(Gap(self.size, self.published, bw).reachable for _, bw in self.partner_figures)
        return "outside" if reachable else "inside"

    @property
    def one_meets_all(self) -> bool:
        """Whether one prediction meets the goal on this table and every partner at once."""
        return Spread(self.size, self.figures).reachable

    @property
    def figures(self) -> tuple[float, ...]:
        """This table's figure, then its partners'."""
        return (self.published, *(bw for _, bw in self.partner_figures))

    @property
    def floor(self) -> float:
        """The least worst error any one prediction can have on this table and its partners at once:
        (max - min) / (max + min) (`Gap.floor` of the two extremes)."""
        return Gap(self.size, min(self.figures), max(self.figures)).floor

    @property
    def model_worst(self) -> float:
        """The model's worst |error| on this table and its partners."""
        return max(abs(self.model - p) / p for p in self.figures)

    @property
    def model_side(self) -> str:
        """Where the model lies against this table's and its partners' figures: "between" them (inclusive),
        "above all" or "below all"."""
        if self.model > max(self.figures):
            return "above all"
        return "below all" if self.model < min(self.figures) else "between"

    @property
    def model_meets_a_partner(self) -> bool:
        return any(meets(self.model, bw, self.size) for _, bw in self.partner_figures)


def judge(t: Table, size: int, model: float, pool: Sequence[Table], minors: int = NEAR_MINORS) -> MissVerdict:
    """A miss of the model (`model` GB/s at `size` on table `t`) against `t`'s partners in `pool`."""
    published = dict(t.rows)[size]
    figures = tuple((p.name, bw) for p in partners(t, pool, minors) for s, bw in p.rows if s == size and bw > 0)
    return MissVerdict(size, published, model, figures)
