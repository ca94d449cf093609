"""The shared 4-of-8 H100 host's LL misses at 1-2 MiB split into the kernel and the host's launches, against one
published session that ran the same all-reduce eager (-G 0) and as a CUDA graph (-G 1), whose host launches no call
(tests/data/nccl_small/waynehacking8_h100_g4_graph.csv; docs/validation.md, "The misses looked at again")."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.report import host_launch as hl

ROWS = Path(__file__).parent / "data" / "nccl_small" / "waynehacking8_h100_g4_graph.csv"
MIB = 1 << 20


def _published() -> dict[str, dict[int, float]]:
    """Per mode (eager, graph), the faster of the out-of-place and in-place times of each size (µs)."""
    lines = [ln for ln in ROWS.read_text().splitlines() if not ln.startswith("#")]
    out: dict[str, dict[int, float]] = {}
    for r in csv.DictReader(lines):
        out.setdefault(r["mode"], {})[int(r["size_bytes"])] = min(float(r["time_us_out"]), float(r["time_us_in"]))
    return out


def _simulated(
    tmp_path: Path, graph: int, sizes: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> dict[int, float]:
    """`phantora nccl-tests all_reduce_perf` as the session ran it, from sizes[0] to sizes[1]: 4 H100s on an
    NVSwitch, -g 4, NCCL 2.29.2."""
    topo = tmp_path / "h100x4.toml"
    topo.write_text('gpu = "h100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 4\n')
    argv = ["nccl-tests", "all_reduce_perf", "--topology", str(topo), "-b", sizes[0], "-e", sizes[1], "-f", "2"]
    assert main([*argv, "-g", "4", "-w", "5", "-n", "50", "-G", str(graph)]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    return {int(r[0]): float(r[5]) for r in rows}


@pytest.fixture
def nccl_2_29(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.29.2")


@pytest.mark.usefixtures("nccl_2_29")
def test_the_kernel_alone_meets_the_graph_run_from_1_mib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-G 1 at 1-16 MiB (Ring LL, LL128, Simple): the model's kernel within 10% of the published graph rows
    (2026-12-03: -6.4 / -3.4 / -4.5 / -4.6 / +8.6%), so the eager miss at 1 MiB is not the kernel's."""
    published = _published()["graph"]
    simulated = _simulated(tmp_path, 1, ("1M", "16M"), capsys)
    errors = {s: (simulated[s] - t) / t for s, t in published.items() if s >= MIB}
    assert len(errors) == 5
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.usefixtures("nccl_2_29")
def test_the_eager_floor_is_the_hosts_launches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Eager, 8 B-4 KiB (one channel, every call host-bound): the model's time is its 4 launches of
    `host_launch_us(1)` and one kernel over the 50 calls; the session's floor lies more than 25% above it
    (2026-12-03: median 23.97 µs against 17.37, 6.0 µs a launch against 4.29), and its graph rows of those sizes
    more than 25% under the eager ones: this host launches a call slower than the host the constants were fitted
    on (Together's, NCCL 2.26.2), which no NCCL code sets."""
    eager = _published()["eager"]
    simulated = _simulated(tmp_path, 0, ("8", "4K"), capsys)
    tiny = [s for s in eager if s <= 4096]
    assert len(tiny) == 10
    for s in tiny:
        assert simulated[s] == pytest.approx(4 * hl.host_launch_us(1) + 10.2 / 50, abs=0.02)
    floor = statistics.median(eager[s] for s in tiny)
    assert floor > 1.25 * statistics.median(simulated[s] for s in tiny)
    graph = _published()["graph"]
    assert all(graph[s] < 0.75 * eager[s] for s in tiny)
