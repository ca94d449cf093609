"""nccl-tests' launching thread under -g N: a cost per GPU's call and one per work batch (a channel) NCCL builds
(phantora/report/host_launch.py), in closed form and through `phantora nccl-tests`."""

from __future__ import annotations

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
