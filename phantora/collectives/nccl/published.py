"""Published nccl-tests measurements (tests/data/nccl_tests/, cited in its SOURCES.md) and the simulated machine
each one ran on, for checking the NCCL model against them (bench/bench_nccl_tests.py, tests/test_nccl_published.py).

Each CSV's first line (`# system=...; gpus=N; nodes=M; ...`) says the machine; the file name says the GPU and the
test (`<gpu>_<n>gpu_<m>node_..._<test>_<source>.csv`). A table taken with `NCCL_ALGO=...` is simulated with the
same restriction. Tables whose source calls the system degraded or misconfigured, or whose times are unstable (a
time that falls by more than the comparison's 15% as the size doubles), are listed but not compared.
Tables whose first line says `held_out=yes` are held out: added after the model was built and never used to fit it
(B200, GB200 NVL72), `tables()` leaves them out unless asked, so that the fitting benches never see them, and
bench/bench_nccl_tests.py reports them apart.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from phantora.collectives.nccl.settings import ENV_VARS
from phantora.topology.model import Topology

TESTS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")
# misconfigured, unstable (a time that falls as the size doubles), or a fabric outside the validation's 400G
# InfiniBand/RoCE (TCPXO, EFA; see SOURCES.md)
DEGRADED = ("nccltests290_default", "nccltests290_ring", "a3megafork", "_efa_", "dranetgke")
# not built by `machine`: PCIe cards on an NVLink bridge; a NIC the source states nowhere (cluster00), or one
# inferred only from the same cluster's own measured rates (cluster01's multi-host runs, SOURCES.md)
NOT_MODELLED = ("pcie", "nicunknown", "nic400assumed")
# Sizes whose published (out-of-place) time includes the connection of an algorithm NCCL first picks there
# (first_use.py: NCCL 2.22-2.27 connect at first use; nccl-tests before v2.16.8 warms up only its largest and
# smallest sizes). Each is `first_uses` of its run (tests/test_nccl_first_use.py); not compared.
SETUP_POINTS: dict[str, dict[int, str]] = {
    "h100_32gpu_4node_ib400_all_reduce_nccltests309_gjaion_default": {2 << 20: "nvls_tree"},  # NCCL as the 8 hosts'
    "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm": {2 << 20: "nvls_tree"},  # NCCL 2.26.2
    "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_default": {8 << 20: "nvls_tree"},  # not stated: 2.22-2.27
    "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_minctas24": {8 << 20: "nvls_tree"},
}


# Tables whose NCCL is not stated, and the version taken for their tuner (PHANTORA_NCCL_VERSION): gj-aion's #309
# runs have the first-use points that only NCCL 2.22-2.27's tuner makes (first_use.py; SETUP_POINTS above), and
# the two other clusters state 2.26.2. The A4 (8 x B200) runs of gpu-tpu-pedia were published on 2025-10-27,
# so their NCCL is at most 2.28 (v2.28.7-1: 2025-10-17), not the model's 2.30 and its SM100 NVLS-Tree tuning
# (v2.30.3-1, 2026-04); 2.27 and 2.28 size Blackwell's NVLS alike (24 CTAs in one node, 32 across), and the one
# host's 4 -> 8 GiB step gives 24 CTAs' chunk cost, not 32's (docs/validation.md, "Held-out tables").
NCCL_INFERRED = {"nccltests309_gjaion": "2.26", "gkea4deepep": "2.28.7"}

ITERS = 20  # nccl-tests' default timed iterations (src/common.cu: `int iters = 20;`, set by -n / --iters)
# Where a first line says the timed iterations: nccl-tests' --iters N; its -n N after its -w N (srun's and mpirun's
# -w take a node list, not a count), or in the same clause as the *_perf binary or "nccl-tests" after it (a -n
# before the binary is mpirun's process count); or the words "iters N" (nccl-tests' header prints "iters: N").
_ITERS = (
    r"--iters[ =](\d+)",
    r"-w\s*\d+\s+-n\s*(\d+)",
    r"(?:_perf|nccl-tests)\b[^;()]*?\s-n\s*(\d+)",
    r"(?<![-\w])iters:?\s+(\d+)",
)


@dataclass(frozen=True)
class Table:
    """One published nccl-tests table."""

    path: Path
    gpu: str
    gpus: int
    nodes: int
    test: str
    nccl_algo: str | None  # NCCL_ALGO the table was taken with, if any
    rows: tuple[tuple[int, float], ...]  # (size in bytes, busbw GB/s)
    nic_gbps: int = 400  # each GPU's NIC (several nodes), from the first line's nic=... (400G unless it says)
    forced: tuple[tuple[str, str], ...] = ()  # other NCCL_* variables of the table that phantora honours
    gpus_per_thread: int = 1  # nccl-tests' -g (one process driving its GPUs), 1 under mpirun / srun
    cpu: str = ""  # the hosts' CPU, from the first line's cpu=... (NCCL's net overhead follows its vendor)
    iters: int = ITERS  # nccl-tests' timed iterations (-n), where the first line says them (`iterations`)
    held_out: bool = False  # never used to fit the model (`held_out=yes` in the first line)

    @property
    def env(self) -> dict[str, str]:
        """The NCCL environment the table was taken with, as far as phantora honours it."""
        return {**dict(self.forced), **({"NCCL_ALGO": self.nccl_algo} if self.nccl_algo else {})}

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def kind(self) -> str:
        return {"alltoall": "all_to_all", "sendrecv": "send_recv"}.get(self.test, self.test)


def data_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "tests" / "data" / "nccl_tests"


def read_table(path: Path) -> Table:
    """Parse one CSV of tests/data/nccl_tests."""
    lines = path.read_text().splitlines()
    head = lines[0]
    gpus = int(re.search(r"gpus=(\d+)", head).group(1))  # type: ignore[union-attr]
    nodes = int(re.search(r"nodes=(\d+)", head).group(1))  # type: ignore[union-attr]
    algo = re.search(r"NCCL_ALGO=(\w+)", head)
    test = next(t for t in TESTS if f"_{t}_" in path.name)
    rows = [(int(r["size_bytes"]), float(r["busbw_gbs"])) for r in csv.DictReader(lines[1:]) if r["busbw_gbs"]]
    gpu = path.name.split("_")[0]
    forced = algo.group(1) if algo else None
    if forced == "NVLS" and gpu.startswith("a100"):
        forced = None  # no NVLS on A100: that NCCL (2.18) ran its default choice (SOURCES.md)
    nic = re.search(r"nic=[^;]*?(\d+)\s*G", head)
    env = tuple((k, v) for k, v in re.findall(r"(NCCL_\w+)=(\w+)", head) if k in ENV_VARS and k != "NCCL_ALGO")
    env += _nccl_version(path.name, head)
    g = re.search(r"(?:^|\s)-g (\d+)", head)
    per_thread = int(g.group(1)) if g else 1
    cpu = re.search(r"cpu=([^;]*)", head)
    nic_gbps, host_cpu = int(nic.group(1)) if nic else 400, cpu.group(1).strip() if cpu else ""
    held = re.search(r"held_out=yes\b", head) is not None
    return Table(
        path, gpu, gpus, nodes, test, forced, tuple(rows), nic_gbps, env, per_thread, host_cpu, iterations(head), held
    )


def iterations(head: str) -> int:
    """The timed iterations a table's first line states (`_ITERS`), or nccl-tests' default if it states none or
    two different counts."""
    found = {int(m) for pattern in _ITERS for m in re.findall(pattern, head)}
    return found.pop() if len(found) == 1 else ITERS


def _nccl_version(name: str, head: str) -> tuple[tuple[str, str], ...]:
    """("PHANTORA_NCCL_VERSION", "MAJOR.MINOR[.PATCH]") from the first line's nccl=... or NCCL_INFERRED; () if
    neither says. The patch counts where a patch release changed the tuner (old_tuners.py)."""
    stated = re.search(r"nccl=(\d+\.\d+(?:\.\d+)?)", head)
    inferred = next((v for k, v in NCCL_INFERRED.items() if k in name), None)
    version = stated.group(1) if stated else inferred
    return (("PHANTORA_NCCL_VERSION", version),) if version else ()


def tables(include_degraded: bool = False, include_held_out: bool = False) -> list[Table]:
    """Every published table of a machine `machine` builds, sorted by name (without the degraded ones, nor the
    held-out ones, unless asked)."""
    out = [read_table(p) for p in sorted(data_dir().glob("*.csv"))]
    out = [t for t in out if not any(d in t.name for d in NOT_MODELLED) and (include_held_out or not t.held_out)]
    return [t for t in out if include_degraded or not any(d in t.name for d in DEGRADED)]


def not_compared() -> list[tuple[str, str]]:
    """The tables kept in the data but left out of the comparison, each with the reason (SOURCES.md says more)."""
    why = {
        "nccltests290_default": "degraded: its reporter calls it so (about 155 GB/s busbw)",
        "nccltests290_ring": "degraded: about 90 GB/s busbw, far below what NVIDIA says 8 x 400G give",
        "a3megafork": "not RDMA (GCP A3 Mega: GPUDirect-TCPXO over Ethernet)",
        "_efa_": "not InfiniBand/RoCE (AWS EFA: SRD through the aws-ofi-nccl plugin, 4 x 100G per GPU; its 20 us "
        "8-byte latency and the plugin's costs are in no NCCL code; docs/validation.md)",
        "dranetgke": "unstable: its time falls by over 15% as the size doubles (2 -> 4 MiB: 1753.7 -> 933.6 us; "
        "16 -> 32 MiB: 1479.0 -> 1240.7 us) and stays at 234-328 us from 1 to 128 KiB, ten times a 2-host "
        "all-gather's latency (docs/validation.md)",
        "pcie": "PCIe cards on an NVLink bridge: not a machine `machine` builds",
        "nicunknown": "the cluster's NIC is stated nowhere",
        "nic400assumed": "the cluster's NIC is stated nowhere; 400G was inferred from its own sendrecv and "
        "all-to-all rates, so the table cannot check the model's network",
    }
    out = []
    for path in sorted(data_dir().glob("*.csv")):
        reason = next((r for key, r in why.items() if key in path.stem), None)
        if reason is not None:
            out.append((path.stem, reason))
    return out


def machine(table: Table) -> Topology:
    """The simulated machine of a table: one DGX/HGX host, or rail-optimised hosts with one NIC per GPU at the
    table's rate; the hosts' CPU as the table states it."""
    from phantora.topology import dgx_host, rail_optimized

    if table.nodes == 1:
        topo = dgx_host(gpus_per_host=table.gpus, gpu=table.gpu)
    else:
        per_node = table.gpus // table.nodes
        topo = rail_optimized(table.nodes, per_node, spines=8, nic_rate=f"{table.nic_gbps}Gbps", gpu=table.gpu)
    if table.cpu:
        topo.meta["cpu"] = table.cpu
    return topo
