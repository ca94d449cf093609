"""nccl-tests' rows of count 0: NCCL 2.20+ discards the calls, so the time is the host's path through the API
(phantora/collectives/nccl/empty_call.py), against the published rows (tests/data/nccl_small/empty_calls.csv) and
in closed form through `phantora nccl-tests`."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.collectives.nccl import empty_call as ec
from phantora.collectives.nccl import tables as T
from phantora.report.host_launch import host_launch_us, work_batches

ROWS = Path(__file__).parent / "data" / "nccl_small" / "empty_calls.csv"


def _published() -> list[dict[str, str]]:
    with ROWS.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _times(system: str) -> list[float]:
    rows = [r for r in _published() if r["system"] == system]
    return [float(r[c]) for r in rows for c in ("time_us_out", "time_us_in")]


def test_the_cost_is_the_median_of_together_g8_over_its_eight_gpus() -> None:
    """The fit: Together's 32 figures (ring and NCCL's choice, all_gather and reduce_scatter, both column groups)
    have a median of 0.93 µs for the thread's 8 calls."""
    together = _times("together_h100")
    assert len(together) == 32
    assert statistics.median(together) / 8 == pytest.approx(ec.EMPTY_CALL_US)


@pytest.mark.parametrize(("system", "low", "high"), [("waynehacking8_h100_slice4", 0.8, 0.85),
                                                     ("alcf_sophia_a100", 0.55, 0.56),
                                                     ("gke_a4_b200", 1.9, 2.0)])  # fmt: skip
def test_other_hosts_are_held_out_within_a_factor_of_two(system: str, low: float, high: float) -> None:
    """Model / published median on the held-out hosts: -g 4 on another H100 host 0.83, -g 1 on a DGX A100 (EPYC
    7742) 0.55, -g 1 on a B200 GKE node over 100 iterations 1.94: the host's CPU, as for launches."""
    rows = [r for r in _published() if r["system"] == system]
    k = {int(r["gpus_per_thread"]) for r in rows}.pop()
    ratio = ec.empty_ns_per_call(k) / 1e3 / statistics.median(_times(system))
    assert low <= ratio <= high


def test_nccl_discards_a_collective_from_2_20_and_the_coll_api_all_to_all_from_2_28() -> None:
    """enqueue.cc: taskAppend returns on count 0 from v2.20.3-1 (v2.19.3-1 still makes a task and a kernel); a
    send / recv of count 0 is never dropped, so nccl-tests' send/recv groups (alltoall, gather, scatter before
    ncclAlltoAll / ncclGather / ncclScatter of 2.28) launch."""
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert ec.discards_empty(kind, (2, 20)) and not ec.discards_empty(kind, (2, 19))
    for kind in ("all_to_all", "gather", "scatter"):
        assert ec.discards_empty(kind, (2, 28)) and not ec.discards_empty(kind, (2, 27))
    for kind in ("send_recv", "hypercube"):
        assert not ec.discards_empty(kind, (2, 30))
    with pytest.raises(ValueError, match="GPUs per thread"):
        ec.empty_ns_per_call(0)


def _zero_rows(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[tuple[float, float]]:
    assert main(argv) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    return [(float(r[5]), float(r[9])) for r in rows if r[0] == "0"]


@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("extra", [[], ["-m", "4"], ["-z", "1"], ["-z", "3"], ["-C", "1"], ["-n", "7"]])
def test_a_row_of_count_0_is_k_empty_calls(gpus: int, extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """-g k: k empty calls of the thread a call, whatever -m (each of its calls runs the path), -z (nothing to wait
    for), -n, and under -C (the host's time is all of it); both column groups."""
    np = ["--np", str(8 // gpus)]  # 8 ranks on dgx8, k to a process
    argv = ["nccl-tests", "all_gather_perf", "-b", "8", "-e", "64", "-f", "2", "-g", str(gpus), *np, "-w", "1", *extra]
    rows = _zero_rows(argv, capsys)
    assert len(rows) == 4  # 8 to 64 B over 8 ranks: under 16 B a rank, 0 floats
    want = round(ec.empty_ns_per_call(gpus) / 1e3, 2)
    assert rows == [(want, want)] * 4


def test_under_a_graph_an_empty_call_captures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """-G 1: the API path runs while capturing, outside the timed replay, and captures no node; the replay's launch
    of the empty graph is host time phantora does not model for any -G row (the GPUs' time alone), so 0."""
    rows = _zero_rows(["nccl-tests", "reduce_scatter_perf", "-b", "8", "-e", "8", "-g", "8", "-G", "1"], capsys)
    assert rows == [(0.0, 0.0)]


def test_all_to_all_is_empty_only_as_ncclalltoall(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """alltoall_perf calls ncclAlltoAll from NCCL 2.28 (dropped at count 0); NCCL 2.26 runs nccl-tests' group of
    zero-byte sends and receives, which NCCL launches (tests/test_nccl_empty_launch.py): the -g 8 thread's launches,
    not its empty calls: 8 launches of one channel to 7 peers each, then the first iteration's LL launch on the
    GPUs (6.6 µs) over the 20."""
    argv = ["nccl-tests", "alltoall_perf", "-b", "8", "-e", "8", "-g", "8"]
    assert _zero_rows(argv, capsys) == [(0.93, 0.93)]
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.26")
    host = round(host_launch_us(work_batches("all_to_all", 1, 8)) * 1000 * 8)
    want = round((20 * host + round(T.BASE_LAT["ring"][T.PROTOCOLS.index("LL")] * 1000)) / 20 / 1e3, 2)
    assert _zero_rows(argv, capsys) == [(want, want)]
