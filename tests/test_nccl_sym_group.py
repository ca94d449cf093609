"""nccl-tests' -m with -R 2: several symmetric calls in one NCCL group, against NCCL's rules restated.

2.27 (enqueue.cc `ncclPrepareTasks`) runs a symmetric kernel only for a group of one collective (`nTasksColl == 1`):
a group of several runs NCCL's legacy algorithms. 2.28 - 2.30 (scheduler/symmetric_sched.cc) put a group's calls of
one (function, reduction, type) into one kernel: `ncclSymkPickKernel` rates the total of the counts, each rounded up
to 1 KiB cells (`countTotal`), takes its size limits from the largest (`countMax`) and, "we currently don't support
grouping for LL kernels", drops the LL kernels when there is more than one work. The time below is `queryModel`'s,
written out from its constants in tests/test_nccl_symmetric.py (`ar_candidates`), not read back from the code.
"""

from __future__ import annotations

import json
import math

import pytest

from phantora.collectives import Collective, decompose
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized
from tests.test_nccl_symmetric import GIB_US, H100, RANKS, KiB, ar_candidates, best, opts

SYM = {"PHANTORA_NCCL_REGISTER": "2"}


def group_dag(nbytes: int, calls: int, version: str, topo=H100, ranks=RANKS, dtype: str = "fp32", **env: str):
    coll = Collective("all_reduce", ranks, nbytes, dtype, group_calls=calls)
    return decompose(coll, topo, opts(**SYM, PHANTORA_NCCL_VERSION=version, **env))


def no_ll(cands: dict[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
    return {k: v for k, v in cands.items() if "LL" not in k}


@pytest.mark.parametrize("version", ["2.28.3", "2.29.7", "2.30.7"])
def test_four_small_all_reduces_are_one_non_ll_kernel_on_their_total(version):
    """8 H100s, 4 x 8 KiB fp32 in one group: alone each would run AllReduce_AGxLLMC_R; grouped, the picker rates
    32 KiB without LL kernels: RSxLDMC_AGxSTMC on divUp(16, 8) = 2 CTAs or fewer, at its model time, recorded
    with the group's size; its flows carry the four calls' bytes (GPU i -> i + 1, 4 S x 9 / 8)."""
    s = 8 * KiB
    assert best(ar_candidates(s)) == "AllReduce_AGxLLMC_R"
    cands = no_ll(ar_candidates(4 * s))
    kernel = best(cands)
    t, ctas = cands[kernel]
    assert kernel == "AllReduce_RSxLDMC_AGxSTMC"
    dag = group_dag(s, 4, version)
    c = dag.choice or {}
    assert (c["algorithm"], c["kernel"], c["channels"], c["group_calls"]) == ("sym", kernel, ctas, 4)
    assert c["protocol"] == "Simple"
    assert c["model_time_us"] == pytest.approx(t, abs=1e-3)
    assert {(f.src, f.dst) for f in dag.flows} == {(i, (i + 1) % 8) for i in range(8)}
    assert all(f.size == 4 * s * 9 // 8 for f in dag.flows)


def test_counts_are_rounded_up_to_cells_each_before_they_add_up():
    """Without NVLS, 4 calls of one float each: each count rounds up to a 1 KiB cell, so the picker rates
    AllReduce_RSxLD_AGxST on 4 KiB (busBytes 2 x 4096 x 7 / 8), not on 16 B, while the flows carry the 16 B."""
    cands = no_ll(ar_candidates(4 * KiB))
    del cands["AllReduce_RSxLDMC_AGxSTMC"]  # NCCL_NVLS_ENABLE=0: no multicast
    t, ctas = cands["AllReduce_RSxLD_AGxST"]
    dag = group_dag(4, 4, "2.28.3", NCCL_NVLS_ENABLE="0")
    c = dag.choice or {}
    assert (c["kernel"], c["channels"]) == ("AllReduce_RSxLD_AGxST", ctas)
    assert c["model_time_us"] == pytest.approx(t, abs=1e-3)
    assert c["model_time_us"] > ar_candidates(16)["AllReduce_RSxLD_AGxST"][0] + 0.02
    assert sum(f.size for f in dag.flows) == 56 * 4  # 2 S / n = 4 B a pair (S = 16 B), 56 pairs


def test_2_27_runs_no_symmetric_kernel_for_a_group_of_several():
    """2.27: a group of 4 runs NCCL's legacy kernels, its tuner's pick for the group's aggregate (the four calls'
    32 KiB, enqueue.cc `ncclPrepareTasks`; tests/test_nccl_coll_group.py), the same as without registration; a
    group of one the kernel."""
    grouped = group_dag(8 * KiB, 4, "2.27.3").choice or {}
    total = decompose(Collective("all_reduce", RANKS, 32 * KiB, "fp32"), H100, opts(PHANTORA_NCCL_VERSION="2.27.3"))
    assert grouped["algorithm"] != "sym" and grouped == {**(total.choice or {}), "group_calls": 4}
    assert (group_dag(8 * KiB, 1, "2.27.3").choice or {})["kernel"] == "AllReduce_AGxLLMC_R"


def test_the_group_ends_at_its_one_latency_plus_the_nvlinks_time_on_an_idle_host():
    """The flow engine: one baseLat for the four calls, then 4 S x 9 / 8 out of each GPU at the NVLink's 450 GB/s
    (above the model's bandwidth on 1-2 CTAs, so the link binds): model time - its bandwidth part + NVLink time."""
    s = 8 * KiB
    dag = group_dag(s, 4, "2.28.3")
    c = dag.choice or {}
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    end_us = max(x.end_ns for x in sim.drain()) / 1000
    total = 4 * s
    sm, peak = 65 * GIB_US, 480 * GIB_US
    bw = peak - sm * math.log1p(math.expm1(peak / sm) * math.exp(-c["channels"] * 8))
    bw_part = (total // 8 + total) / bw
    assert bw * 1e-3 > 450  # GB/s: the model asks more than the NVLink has
    assert end_us == pytest.approx(c["model_time_us"] - bw_part + total * 9 / 8 / 450e3, abs=0.005)


def test_what_is_not_modelled_or_fails_in_nccl_is_one_line():
    """Past a kernel's arguments every 2.28+ cuts the group into kernels (tests/test_nccl_sym_kernels_cut.py; 2.30.7:
    55 calls a kernel). NCCL_SYM_KERNEL naming
    an LL kernel: 2.28 fails the group ("no symmetric kernel available"), 2.29+ falls back to the legacy
    algorithms. Across hosts an all-gather group on GIN kernels: refused; an all-reduce there is legacy anyway."""
    assert (group_dag(8 * KiB, 49, "2.30.7").choice or {})["group_calls"] == 49
    assert (group_dag(8 * KiB, 56, "2.30.7").choice or {})["plans"] == 2
    ll = {"NCCL_SYM_KERNEL": "AllReduce_AGxLLMC_R"}
    with pytest.raises(InputError, match="no symmetric kernel available"):
        group_dag(8 * KiB, 4, "2.28.3", **ll)
    assert (group_dag(8 * KiB, 4, "2.30.7", **ll).choice or {})["algorithm"] != "sym"
    topo = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")
    ranks = tuple(range(16))
    gin = Collective("all_gather", ranks, 8 << 20, "fp32", group_calls=2)
    with pytest.raises(InputError, match="GIN kernels"):
        decompose(gin, topo, opts(**SYM, PHANTORA_NCCL_VERSION="2.30.7"))
    assert (group_dag(8 * KiB, 4, "2.30.7", topo, ranks).choice or {})["algorithm"] != "sym"


def _results(argv: list[str], out) -> list[dict]:
    from phantora.cli import main

    assert main(["nccl-tests", *argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["sizes"]


def test_nccl_tests_m4_runs_one_kernel_a_group(tmp_path, monkeypatch, capsys):
    """`phantora nccl-tests all_reduce_perf -R 2 -m 4` on 8 H100s: 2.28 records the grouped kernel (no LL) and a
    call's time is the group's over 4, less than a lone call's (one kernel latency for four calls); 2.27 records
    NCCL's tuner's pick."""
    argv = ["all_reduce_perf", "-b", "8K", "-e", "8K", "-n", "2", "-w", "0", "-R", "2"]
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.28.3")
    four = _results([*argv, "-m", "4"], tmp_path / "m4")[0]
    one = _results(argv, tmp_path / "m1")[0]
    assert (four["choice"]["kernel"], four["choice"]["group_calls"]) == ("AllReduce_RSxLDMC_AGxSTMC", 4)
    assert one["choice"]["kernel"] == "AllReduce_AGxLLMC_R" and "group_calls" not in one["choice"]
    assert four["time_us"] < one["time_us"]
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    old = _results([*argv, "-m", "4"], tmp_path / "m4_27")[0]
    assert old["choice"]["algorithm"] != "sym"


def sizes_dag(sizes: tuple[int, ...], version: str, **env: str):
    """A live coalesced call on symmetric windows: its calls' bytes (`group_sizes`), as backend.py sends them."""
    coll = Collective("all_reduce", RANKS, sum(sizes), "fp32", group_sizes=sizes)
    return decompose(coll, H100, opts(**SYM, PHANTORA_NCCL_VERSION=version, **env))


@pytest.mark.parametrize("version", ["2.28.3", "2.30.7"])
def test_a_coalesced_call_of_unequal_calls_is_one_non_ll_kernel_on_their_summed_counts(version):
    """A coalesced call of 8 KiB + 24 KiB fp32 all-reduces: symmetric_sched.cc rates countTotal, 32 KiB, without LL
    kernels (nWorks 2), so RSxLDMC_AGxSTMC at queryModel's time for 32 KiB, as 4 x 8 KiB; alone the 8 KiB call
    would run AGxLLMC_R. Before, the call was one symmetric call of 32 KiB with the LL kernels in the running."""
    cands = no_ll(ar_candidates(32 * KiB))
    kernel = best(cands)
    t, ctas = cands[kernel]
    c = sizes_dag((8 * KiB, 24 * KiB), version).choice or {}
    assert (c["algorithm"], c["protocol"], c["kernel"], c["channels"]) == ("sym", "Simple", kernel, ctas)
    assert c["group_calls"] == 2
    assert c["model_time_us"] == pytest.approx(t, abs=1e-3)
    # the group's 32 KiB over the bandwidth part (~0.076 us; model_lat_us is rounded to the ns, hence 2 %)
    assert c["model_algbw_gbs"] == pytest.approx(32 * KiB / (1000 * (t - c["model_lat_us"])), rel=2e-2)


def test_a_coalesced_calls_counts_round_up_to_cells_each():
    """Three 4-byte calls and one of 1 KiB without NVLS: each rounds up to a 1 KiB cell, the picker rates 4 KiB
    (as four calls of one float), while the flows carry the 1036 B the calls hold (2 S / n a pair, 56 pairs)."""
    cands = no_ll(ar_candidates(4 * KiB))
    del cands["AllReduce_RSxLDMC_AGxSTMC"]
    t, ctas = cands["AllReduce_RSxLD_AGxST"]
    dag = sizes_dag((4, 4, 4, KiB), "2.28.3", NCCL_NVLS_ENABLE="0")
    c = dag.choice or {}
    assert (c["kernel"], c["channels"], c["group_calls"]) == ("AllReduce_RSxLD_AGxST", ctas, 4)
    assert c["model_time_us"] == pytest.approx(t, abs=1e-3)


def test_a_coalesced_call_under_2_27_runs_the_legacy_aggregate():
    """2.27 runs a symmetric kernel only for a group of one collective: a coalesced call of 4 x 8 KiB on symmetric
    windows runs NCCL's tuner on the 32 KiB aggregate, as without registration."""
    c = sizes_dag((8 * KiB,) * 4, "2.27.3").choice or {}
    plain = decompose(Collective("all_reduce", RANKS, 32 * KiB, "fp32"), H100, opts(PHANTORA_NCCL_VERSION="2.27.3"))
    assert c["algorithm"] != "sym" and c == {**(plain.choice or {}), "group_calls": 4}
