"""nccl-tests' launching thread under -g N: a cost per GPU's call and one per work batch (a channel) NCCL builds
(phantora/report/host_launch.py), in closed form and through `phantora nccl-tests`."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.report import host_launch as hl

# Together's -g 8 ring all-gather, NCCL 2.26.2 (all_gather_ring.out, tests/data/nccl_tests/SOURCES.md), out of
# place: the mean of its 128 B-8 KiB rows (one channel) and of its 1-4 MiB rows (24 channels), in µs.
ONE_CHANNEL_US = (35.05 + 34.28 + 34.88 + 34.78 + 35.34 + 34.61 + 35.09) / 7
FULL_US = (41.67 + 41.48 + 41.34) / 3


def test_the_cost_is_a_call_plus_its_work_batches() -> None:
    assert hl.host_launch_us(0) == hl.HOST_LAUNCH_US
    assert hl.host_launch_us(24) - hl.host_launch_us(1) == pytest.approx(23 * hl.HOST_CHANNEL_US)
    assert hl.work_batches("all_reduce", 16, 8) == 16  # one per channel of a collective
    assert hl.work_batches("all_to_all", 2, 8) == 14  # one per channel of each of the 7 peers
    assert hl.work_batches("send_recv", 4, 8) == 4
    assert hl.work_batches("all_gather", None, 8) == hl.DEFAULT_BATCHES
    with pytest.raises(ValueError, match="work batches"):
        hl.host_launch_us(-1)


def test_a_group_of_several_plans_launches_a_kernel_for_each() -> None:
    """NCCL 2.22+ launches one kernel per plan of a group (enqueue.cc ncclLaunchPrepare, coll_group.plans): a
    choice of 2 plans costs one more launch, its channels' batches as before."""
    one = {"channels": 1}
    two = {"channels": 1, "plans": 2}
    assert hl.host_ns_per_call("all_reduce", one, 8, 8) == round(hl.host_launch_us(1) * 8000)
    assert hl.host_ns_per_call("all_reduce", two, 8, 8) == round((hl.host_launch_us(1) + hl.HOST_LAUNCH_US) * 8000)


def test_eight_launches_give_the_published_floors_of_one_and_24_channels() -> None:
    """8 launches plus the loop's tail (one GPU time over 20 iterations: NCCL's ring LL latency 6.6 + 7 x 0.6 µs at
    one channel; 17-37 µs at 1-4 MiB) meet the published floors within 1%."""
    tail_one = (6.6 + 7 * 0.6) / 20
    assert 8 * hl.host_launch_us(1) + tail_one == pytest.approx(ONE_CHANNEL_US, rel=0.01)
    tail_full = (17.3 + 23.8 + 36.8) / 3 / 20
    assert 8 * hl.host_launch_us(24) + tail_full == pytest.approx(FULL_US, rel=0.01)


def _time_us(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[float, int]:
    assert main(argv) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#"))
    channels = int(row.split("channels=")[1].split()[0])
    return float(row.split()[5]), channels


@pytest.mark.parametrize(("test", "size", "env"), [("all_gather_perf", "8K", ""), ("all_reduce_perf", "1M", "NVLS")])
def test_a_host_bound_call_costs_its_launches_and_one_gpu_time_over_the_loop(
    test: str, size: str, env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-g 8, host-bound: (20 x 8 launches + one GPU time) / 20 a call, the launches of the call's own channels
    (one for 8 KiB of ring LL, NVLS's 16 CTAs at 1 MiB)."""
    if env:
        monkeypatch.setenv("NCCL_ALGO", env)
    base = ["nccl-tests", test, "-b", size, "-e", size, "-g", "8", "-n", "20", "-w", "1"]
    gpu, channels = _time_us([*base, "-G", "1"], capsys)
    loop, _ = _time_us(base, capsys)
    assert channels == (1 if test == "all_gather_perf" else 16)
    assert loop == pytest.approx(8 * hl.host_launch_us(channels) + gpu / 20, abs=0.02)


SMALL = Path(__file__).parent / "data" / "nccl_small" / "together_h100_g8_below_1mib.csv"
CONFIGS = {"ring": {"NCCL_ALGO": "RING", "NCCL_NVLS_ENABLE": "0"}, "nvls": {"NCCL_NVLS_ENABLE": "1"}}


def _published_small() -> dict[tuple[str, str], dict[int, float]]:
    """Together's -g 8 rows from 8 B to 512 KiB that the constants were not fitted on, per (test, config): the faster
    of the out-of-place and in-place times (two timings of the same call; the slower one carries the run's jitter,
    up to 51% above the other)."""
    lines = [ln for ln in SMALL.read_text().splitlines() if not ln.startswith("#")]
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in csv.DictReader(lines):
        key = (r["test"], r["config"])
        out.setdefault(key, {})[int(r["size_bytes"])] = min(float(r["time_us_out"]), float(r["time_us_in"]))
    return out


def test_the_floor_holds_out_of_sample_on_the_same_nodes_other_collectives(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of sample: 62 published -g 8 rows below 1 MiB (all-reduce, reduce-scatter on ring and NCCL's own choice,
    all-gather's 16-512 KiB, and its NCCL-choice run; tests/data/nccl_small, NCCL 2.26.2) against the model's
    loop. The launches are a floor under the host's jitter, so the model may sit below a row but not above it:
    each row within -12% / +2% of the model, the median |error| at most 2% and at least 80% of rows within 5%
    (2026-11-29: median 1.3%, worst -11.3% at 512 KiB all-reduce, at most +1.7%, 51 of 62 within 5%)."""
    errors: list[float] = []
    for (test, config), published in sorted(_published_small().items()):
        monkeypatch.delenv("NCCL_ALGO", raising=False)
        for k, v in {**CONFIGS[config], "PHANTORA_NCCL_VERSION": "2.26"}.items():
            monkeypatch.setenv(k, v)
        lo, hi = min(published), max(published)
        argv = ["nccl-tests", f"{test}_perf", "-b", str(lo), "-e", str(hi), "-f", "2", "-g", "8", "-w", "5", "-n", "20"]
        assert main(argv) == 0
        rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
        simulated = {int(r[0]): float(r[5]) for r in rows}
        assert set(published) <= set(simulated), (test, config)
        errors += [(simulated[s] - t) / t for s, t in published.items()]
    assert len(errors) == 62
    assert all(-0.12 <= e <= 0.02 for e in errors), sorted(errors)
    assert statistics.median(abs(e) for e in errors) <= 0.02
    assert sum(abs(e) <= 0.05 for e in errors) >= 0.8 * len(errors)
