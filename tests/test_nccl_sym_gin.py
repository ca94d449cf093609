"""Symmetric registration (-R 2) across hosts: NCCL's GIN kernels (src/sym_kernels.cc v2.29.7-1 .. v2.30.7-1
`queryModel_gin`) against closed forms written out from its constants (lsaBw 360 GB/s on Hopper, the 400G NIC's
50 GB/s, ginLat 14 µs, the 1 MiB all-gather chunk, the reduce-scatter's 128 KiB chunk and SM figures), and where
NCCL runs its legacy algorithms instead (no kernel, no GIN) or fails.
"""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized

KiB, MiB = 1 << 10, 1 << 20
TWO = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")
RANKS = tuple(range(16))
LSA = 360e3  # NCCL's Hopper NVLink figure, bytes per µs
NIC = 50e3  # minNetBw of a 400 Gb/s NIC, bytes per µs
GIN_LAT = 14.0  # hwLatencies[NET][RING][SIMPLE], µs


def dag(kind: str, nbytes: int, dtype: str = "bf16", topo=TWO, ranks=RANKS, **env: str):
    env = {"PHANTORA_NCCL_REGISTER": "2", **env}
    return decompose(Collective(kind, ranks, nbytes, dtype), topo, AlgoOptions(nccl_env=nccl_env(env)))


def choice(kind: str, nbytes: int, dtype: str = "bf16", **env: str) -> dict:
    return dag(kind, nbytes, dtype, **env).choice or {}


def test_all_gather_runs_the_rail_ring_at_its_model_time():
    """64 MiB gathered over 2 hosts x 8 H100s: 4 MiB a rank; 4 chunks of 1 MiB x 1 rail hop at 14 µs, and
    max(4 MiB x 16 / 360 GB/s, 4 MiB x 1 / 50 GB/s); CTAs min(4 chunks, divUp(16, 8 heads)) = 2. Flows: each GPU
    puts its part to the same GPU of the other host (4 MiB) and multicasts the 2 parts it has into its host
    (7 x 2 x 4 MiB, GPU i -> i + 1); on an idle fabric the call ends at the estimate."""
    part = 4 * MiB
    bw_us = max(part * 16 / LSA, part / NIC)
    d = dag("all_gather", 16 * part)
    c = d.choice or {}
    assert (c["algorithm"], c["kernel"], c["channels"]) == ("sym", "AllGather_RailRing_LsaSTMC", 2)
    assert c["model_time_us"] == pytest.approx(4 * GIN_LAT + bw_us, abs=1e-3)
    net = {(f.src, f.dst): f.size for f in d.flows if (f.src < 8) != (f.dst < 8)}
    assert net == {(i, (i + 8) % 16): part for i in range(16)}
    nvl = {(f.src, f.dst): f.size for f in d.flows if (f.src < 8) == (f.dst < 8)}
    assert nvl == {(h + i, h + (i + 1) % 8): 7 * 2 * part for h in (0, 8) for i in range(8)}
    sim = FlowSimulator(TWO)
    sim.submit(d.flows, at=0)
    assert max(x.end_ns for x in sim.drain()) / 1000 == pytest.approx(4 * GIN_LAT + bw_us, abs=0.01)


NEW_SM = {True: 4.22e3, False: 13.7e3}  # getSmBw_ReduceScatter_RailA2A on Hopper, 2.30.7: bytes per µs a CTA
OLD_SM = {True: 9.85e3, False: 14.5e3}  # 2.29.7 - 2.30.4


def _muls(rail: int, lsa: int, mc: bool) -> tuple[int, int, int]:
    """(smMul, lsaMul, ginMul) of getBusMul_ReduceScatter_RailA2A."""
    lsa_mul = max((lsa if mc else lsa - 1) * rail, (lsa - 1) * rail)
    sm_mul = (1 if mc else lsa) * (rail - 1) + (1 if mc else lsa) + (rail - 1)
    return sm_mul, lsa_mul, rail - 1


def rs_time(part: int, rail: int, lsa: int, ldmc: bool, sm_bw: dict[bool, float], chunk: int) -> tuple[float, int]:
    """queryModel_gin's reduce-scatter on 8-GPU hosts, written out: the CTAs (a chunk each, at most the count
    that saturates NVLink or the NIC, and the inbox's larger count of LD and LDMC), then the time."""

    def sat(mc: bool) -> int:
        sm, lm, gm = _muls(rail, lsa, mc)
        return math.ceil(min(LSA / lm, NIC / gm) / (sm_bw[mc] / sm))

    ctas = max(1, min(64, max(sat(False), sat(True)), sat(ldmc), -(-part // chunk)))
    sm_mul, lsa_mul, gin_mul = _muls(rail, lsa, ldmc)
    eff = min(ctas * sm_bw[ldmc] / sm_mul, LSA / lsa_mul, NIC / gin_mul)
    return part / eff + min(part, chunk * ctas) * (lsa_mul / LSA + gin_mul / NIC) + GIN_LAT, ctas


def test_reduce_scatter_runs_the_rail_all_to_all_with_multicast_loads():
    """64 MiB reduced over 2 hosts x 8 H100s (bf16: multimem ld_reduce): LsaLDMC, 4 MiB a rank, on the CTAs that
    saturate min(360 GB/s / 16, 50 GB/s / 1) at 4.22 GB/s / 3 a CTA (2.30.7's figures), chunk 128 KiB; LsaLD's
    time is longer. Flows: the other host's part to each rail peer (4 MiB) and 7 x 2 x 4 MiB loaded through the
    switch, GPU i -> i + 1."""
    part = 4 * MiB
    t, ctas = rs_time(part, 2, 8, True, NEW_SM, 128 * KiB)
    t_ld, ctas_ld = rs_time(part, 2, 8, False, NEW_SM, 128 * KiB)
    assert t * (1 + 0.025 * ctas) < t_ld * (1 + 0.025 * ctas_ld)
    d = dag("reduce_scatter", 16 * part)
    c = d.choice or {}
    assert (c["kernel"], c["channels"]) == ("ReduceScatter_RailA2A_LsaLDMC", ctas)
    assert c["model_time_us"] == pytest.approx(t, rel=1e-5)
    assert {f.size for f in d.flows if (f.src < 8) != (f.dst < 8)} == {part}
    assert {f.size for f in d.flows if (f.src < 8) == (f.dst < 8)} == {7 * 2 * part}


def test_reduce_scatter_before_2_30_7_takes_64_kib_chunks_and_the_older_sm_figures():
    """2.29.7 - 2.30.4: chunk 64 KiB, Hopper SM figures 9.85 (LDMC) / 14.5 (LD) GB/s; fp32 has multicast loads."""
    part = 256 * KiB
    t, ctas = rs_time(part, 2, 8, True, OLD_SM, 64 * KiB)
    c = choice("reduce_scatter", 16 * part, "fp32", PHANTORA_NCCL_VERSION="2.30.4")
    assert (c["kernel"], c["channels"]) == ("ReduceScatter_RailA2A_LsaLDMC", ctas)
    assert c["model_time_us"] == pytest.approx(t, rel=1e-5)


def test_the_reduce_scatter_chunk_variable_rounds_down_to_a_power_of_two():
    """NCCL_SYM_RS_GIN_CHUNK_SIZE=100000 -> 64 KiB: a 1 MiB part then starts on 16 CTAs' worth of chunks, capped
    at the saturating count."""
    part = MiB
    t, ctas = rs_time(part, 2, 8, True, NEW_SM, 64 * KiB)
    c = choice("reduce_scatter", 16 * part, NCCL_SYM_RS_GIN_CHUNK_SIZE="100000")
    assert (c["channels"], c["model_time_us"]) == (ctas, pytest.approx(t, rel=1e-5))


@pytest.mark.parametrize(
    ("kind", "env"),
    [
        ("all_reduce", {}),  # no GIN kernel for all-reduce in any release
        ("all_gather", {"PHANTORA_NCCL_VERSION": "2.28.9"}),  # kernels masked across hosts
        ("all_gather", {"PHANTORA_NCCL_VERSION": "2.28.3"}),  # no symmetric support across hosts
        ("reduce_scatter", {"PHANTORA_NCCL_VERSION": "2.29.3"}),  # 2.29.2 - 2.29.3: only an all-gather
        ("all_gather", {"NCCL_GIN_TYPE": "1"}),  # no GIN plugin of that type: windows register nothing
        ("reduce_scatter", {"NCCL_SYM_GIN_KERNELS_ENABLE": "0"}),
        ("all_gather", {"NCCL_NVLS_ENABLE": "0"}),  # the all-gather kernel is a multicast one
    ],
)
def test_legacy_where_nccl_runs_no_symmetric_kernel_across_hosts(kind, env):
    assert choice(kind, 64 * MiB, **env)["algorithm"] != "sym"


def test_gin_types_nccl_has_keep_the_kernels():
    for t in ("2", "3"):
        assert choice("all_gather", 64 * MiB, NCCL_GIN_TYPE=t)["kernel"] == "AllGather_RailRing_LsaSTMC"


@pytest.mark.parametrize(
    ("env", "field", "text"),
    [
        ({"NCCL_GIN_ENABLE": "0"}, "NCCL_GIN_ENABLE", "GIN is disabled"),
        ({"PHANTORA_NCCL_VERSION": "2.29.3"}, "PHANTORA_NCCL_VERSION", "AllGather_GinHier_MCRing"),
    ],
)
def test_refused_in_one_line_where_nccl_fails_or_runs_a_kernel_not_restated(env, field, text):
    with pytest.raises(InputError, match=text) as err:
        choice("all_gather", 64 * MiB, **env)
    assert err.value.field == field and "\n" not in str(err.value)


def test_nccl_tests_all_gather_r2_across_hosts_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from phantora.cli import main

    argv = ["nccl-tests", "all_gather_perf", "-b", "64M", "-e", "64M", "-R", "2", "-n", "2", "-w", "0"]
    assert main([*argv, "--topology", "testbed16"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert "algorithm=sym" in rows[0] and "kernel=AllGather_RailRing_LsaSTMC" in rows[0]
