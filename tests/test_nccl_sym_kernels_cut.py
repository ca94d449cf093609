"""A group of symmetric calls (`-R 2 -m N`, a coalesced call on symmetric windows) that NCCL 2.28+ cuts into several
kernels (symmetric_sched.cc `ncclMakeSymmetricTaskList`, v2.28.3-1 .. v2.30.7-1; collectives/sym_plans.py).

A kernel's 4 KiB of arguments hold its ncclSymkDevWorkArgs (16-aligned), 64 channels' 4-byte work ranges and 64 B
per call; NCCL ends a kernel after the call past which one more would not fit, so a kernel takes
(4096 - args - 256) // 64 calls: args 112 B in 2.28.3 (58 calls), 224 B in 2.28.7 - 2.29.3 (56), 288 B in 2.29.7
and 304 B from 2.30.3 (55; sizeof at each tag, register.py's SYMK_ARGS_BYTES). Each kernel is
picked on its own calls and launched as a plan of its own, after the one before: the group takes the sum of its
kernels' times, and nccl-tests' host one more launch (4.26 us) a kernel.
"""

from __future__ import annotations

import json

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl.host_launch import HOST_CHANNEL_US, HOST_LAUNCH_US
from phantora.collectives.nccl.register import kernel_calls, kernel_works
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts


def _sym(version: str) -> dict[str, str]:
    return {"PHANTORA_NCCL_VERSION": version, "PHANTORA_NCCL_REGISTER": "2"}


def _end_ns(coll: Collective, version: str = "2.28.3") -> tuple[int, dict]:
    dag = decompose(coll, H100, opts(**_sym(version)))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()), dag.choice or {}


def test_a_kernel_takes_the_calls_its_arguments_hold():
    assert kernel_works((2, 28, 3)) == (4096 - 112 - 256) // 64 == 58
    assert kernel_works((2, 28, 7)) == kernel_works((2, 28, 9)) == (4096 - 224 - 256) // 64 == 56
    assert kernel_works((2, 29, 2)) == kernel_works((2, 29, 3)) == 56
    assert kernel_works((2, 29, 7)) == (4096 - 288 - 256) // 64 == 55
    assert kernel_works((2, 30, 3)) == kernel_works((2, 30, 7)) == (4096 - 304 - 256) // 64 == 55
    assert kernel_works((2, 27, 3)) is None


def test_nccl_chains_a_bins_calls_newest_first_then_cuts_the_chain():
    """The newest call heads the chain (`task->next = tasksSymByFnOpTy[index]`), so the first kernel holds the last
    58 calls issued and the second the first call."""
    sizes = (4 * KiB,) * 58 + (MiB,)
    assert kernel_calls(sizes, 58) == [(MiB,) + (4 * KiB,) * 57, (4 * KiB,)]


def test_past_a_kernels_calls_the_group_takes_the_sum_of_its_kernels_times():
    """59 all-reduces of 8 KiB on 8 H100s, 2.28.3: a kernel of 58 (RSxLDMC_AGxSTMC, no LL for several) and a lone
    call's kernel (its own pick, AGxLLMC_R), one after another: the group ends at the two kernels' times summed,
    each as its calls alone (was refused past 48)."""
    many, many_choice = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=58))
    lone, lone_choice = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32"))
    end, got = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=59))
    assert (got["plans"], got["group_calls"]) == (2, 59)
    assert many_choice["kernel"] != lone_choice["kernel"]
    assert end == pytest.approx(many + lone, abs=100)
    assert end / 1000 == pytest.approx(many_choice["model_time_us"] + lone_choice["model_time_us"], abs=0.3)
    assert _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=117))[1]["plans"] == 3


def test_up_to_a_kernels_calls_the_group_is_one_kernel():
    """50 calls under 2.28.3 are one kernel (refused before: past 48)."""
    _, got = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=50))
    assert got["group_calls"] == 50 and "plans" not in got


@pytest.mark.parametrize(("version", "per"), [("2.29.2", 56), ("2.30.7", 55)])
def test_from_2_29_a_group_past_a_kernels_calls_runs_as_its_kernels(version, per):
    """2.29 / 2.30 cut as 2.28 does, at their own arguments' size (refused before, past 48): `per` + 1 all-reduces of
    8 KiB on 8 H100s are a kernel of `per` calls and a lone call's, the group ending at their times summed."""
    many, _ = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=per), version)
    lone, _ = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32"), version)
    end, got = _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=per + 1), version)
    assert (got["plans"], got["group_calls"]) == (2, per + 1)
    assert end == pytest.approx(many + lone, abs=100)
    assert "plans" not in _end_ns(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=per), version)[1]


def test_nccl_tests_charges_a_host_launch_a_kernel(tmp_path, monkeypatch):
    """`all_reduce_perf -b 8K -e 8K -R 2 -m 59` (2.28.3): the first iteration starts after the host's launch of its
    first kernel (4.26 us and one channel's batch, 0.032) and 4.26 us for the second, then takes the GPU time."""
    from phantora.cli import main

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.28.3")
    argv = ["all_reduce_perf", "-b", "8K", "-e", "8K", "-R", "2", "-m", "59", "-n", "2", "-w", "0"]
    assert main(["nccl-tests", *argv, "--out", str(tmp_path)]) == 0
    size = json.loads((tmp_path / "results.json").read_text())["sizes"][0]
    assert size["choice"]["plans"] == 2 and size["choice"]["channels"] == 1
    host_us = HOST_LAUNCH_US + HOST_CHANNEL_US + HOST_LAUNCH_US
    first, second = (t / 1000 for t in size["iter_ns"])
    assert first - second == pytest.approx(host_us, abs=0.01)
