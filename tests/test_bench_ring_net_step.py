"""bench/bench_ring_net_step.py's measure: the published time over the model's per inter-node ring step."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load

bench = load("bench/bench_ring_net_step.py")
nccl_tests = load("bench/bench_nccl_tests.py")
Table = bench.Table
Row = nccl_tests.Row


def _table(test: str, gpus: int, nodes: int) -> object:
    return Table(Path("x.csv"), "h100", gpus, nodes, test, None, ())


def test_a_ring_has_nccls_count_of_inter_node_steps() -> None:
    assert bench.inter_steps("all_reduce", 2) == 2 and bench.inter_steps("all_reduce", 8) == 14
    assert bench.inter_steps("all_gather", 2) == 1 and bench.inter_steps("reduce_scatter", 10) == 9


def test_the_excess_per_step_is_the_time_gap_over_the_steps() -> None:
    """16 GPUs on 2 hosts, all-reduce of 1 MiB: time = 1 MiB x 2 x 15/16 / busbw; the ring has 2 inter-node
    steps. Published 10 GB/s (196.608 us), model 20 GB/s (98.304 us): (196.608 - 98.304) / 2 = 49.152 us."""
    table = _table("all_reduce", 16, 2)
    rows = [Row(1 << 20, 10.0, 20.0, "Ring/LL128/24"), Row(2 << 20, 10.0, 20.0, "Tree/LL128/24")]
    assert bench.time_us(table, 1 << 20, 10.0) == pytest.approx(196.608)
    [(size, us)] = bench.excess_per_step(table, rows, "LL128")  # the tree row is left out
    assert size == 1 << 20 and us == pytest.approx(49.152)
    assert bench.excess_per_step(table, rows, "Simple") == []


def test_moved_sizes_lists_only_the_errors_that_move() -> None:
    before = [Row(1 << 20, 10.0, 19.1, "r"), Row(2 << 20, 10.0, 10.0, "r")]
    after = [Row(1 << 20, 10.0, 10.45, "r"), Row(2 << 20, 10.0, 10.0, "r")]
    assert bench.moved_sizes(before, after) == "1 MiB +91.0% -> +4.5%"
    assert bench.met({"a": after, "b": before, "c": []}) == 1


def test_the_what_if_takes_every_argument_of_nccls_select() -> None:
    """The patched `tuning.select` is called as the NCCL model calls it (with `pipe_ops` since a group's
    aggregates were scheduled as one plan): it takes the same parameters, or every run of the bench fails."""
    import inspect

    from phantora.collectives.nccl import tuning

    patched = bench.with_extra_step(34.0, ("LL128",))
    assert list(inspect.signature(patched).parameters) == list(inspect.signature(tuning.select).parameters)
