"""The opt-in host cost of a gloo group's all-reduce (runtime/gloo_cost.py), read off gloo's README benchmark table
(pytorch/gloo README.md, "Benchmarking": allreduce_ring_chunked, TCP, 4 machines, 40GbE, p50 per float32 count).
The table's rows are restated here from the README, not from the module, so a mistyped row fails."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.launcher import RunConfig, launch
from phantora.runtime import gloo_cost

# (elements, p50 us) as the README prints them, a few rows
README_ROWS = [(1, 263), (1000, 267), (5000, 335), (100000, 487), (1000000, 2286), (2000000, 3993), (5000000, 10608)]


@pytest.mark.parametrize(("elements", "us"), README_ROWS)
def test_each_row_is_the_readmes_p50(elements: int, us: int) -> None:
    assert gloo_cost.table_ns(4 * elements) == us * 1000


def test_between_rows_linear_below_the_first_row_its_figure_past_the_last_its_slope() -> None:
    # 3,500,000 floats: halfway between 2,000,000 (3,993 us) and 5,000,000 (10,608 us)
    assert gloo_cost.table_ns(4 * 3_500_000) == (3_993_000 + 10_608_000) // 2
    assert gloo_cost.table_ns(0) == gloo_cost.table_ns(2) == 263_000  # under one float: the first row's
    # 8,000,000 floats: the last segment's slope (10,608 - 3,993) us per 3,000,000 floats, 3,000,000 floats on
    assert gloo_cost.table_ns(4 * 8_000_000) == 10_608_000 + (10_608_000 - 3_993_000)


def test_the_cost_is_opt_in_for_all_reduce_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, want in (("", 0), ("off", 0), ("readme-40gbe", 263_000)):
        monkeypatch.setenv(gloo_cost.ENV, value)
        gloo_cost.model.cache_clear()
        assert gloo_cost.host_ns("all_reduce", 4) == want  # one float
        assert gloo_cost.host_ns("broadcast", 16) == gloo_cost.host_ns("barrier", 0) == 0
    monkeypatch.setenv(gloo_cost.ENV, "fast")
    gloo_cost.model.cache_clear()
    with pytest.raises(InputError, match="PHANTORA_GLOO_COST='fast': expected one of readme-40gbe or off"):
        gloo_cost.host_ns("all_reduce", 16)
    gloo_cost.model.cache_clear()


PROGRAM = """
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    me = dist.get_rank()
    for n in (4, 1_000_000):
        x = torch.ones(n)
        if me == 1:
            a = torch.randn(1024, 1024, device="cuda")
            (a @ a).sum().item()  # rank 1 enters later
        t0 = time.perf_counter_ns()
        dist.all_reduce(x)
        print("AR", n, me, t0, time.perf_counter_ns(), int(x[0]), flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_live_gloo_all_reduce_ends_at_the_latest_entry_plus_the_readmes_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 floats (between the 2- and 5-float rows, both 261 us): + 261 us; 1,000,000 floats (4 MB): + 2,286 us."""
    monkeypatch.setenv(gloo_cost.ENV, "readme-40gbe")
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    cfg = RunConfig(str(tmp_path / "prog.py"), topology="testbed16", nproc=2, tensors="real", trace="none",
                    timeout_s=120, out_dir=str(tmp_path / "o"))  # fmt: skip
    launch(cfg)
    text = "".join(f.read_text() for f in sorted((tmp_path / "o" / "logs").glob("rank*.log")))
    got: dict[int, dict[int, tuple[int, int, int]]] = {}
    for line in text.splitlines():
        if line.startswith("AR "):
            _, n, r, t0, t1, v = line.split()
            got.setdefault(int(n), {})[int(r)] = (int(t0), int(t1), int(v))
    for n, cost_us in ((4, 261), (1_000_000, 2286)):
        latest = max(got[n][r][0] for r in (0, 1))
        assert got[n][1][0] == latest > got[n][0][0]  # rank 1 computed first
        assert {got[n][r][1] for r in (0, 1)} == {latest + cost_us * 1000}
        assert {got[n][r][2] for r in (0, 1)} == {2}
