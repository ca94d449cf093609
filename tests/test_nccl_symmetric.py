"""Registered buffers (nccl-tests -R, PHANTORA_NCCL_REGISTER) against closed forms from NCCL's own constants.

-R 2: NCCL's symmetric kernels (src/sym_kernels.cc v2.28.3-1 .. v2.30.7-1, src/symmetric.cc v2.27.x): the kernel
its picker runs, its CTAs and the time of its cost model, each written out below from `queryModel`'s constants
(baseLat 4.5 / 7.8 µs on Hopper, smBw 65 GiB/s for all-reduce, peakBw 320 / 480 GiB/s, LL_BusFactor 9, the 2.5 %
CTA tolerance and the 2.5 % per-CTA penalty), not read back from the code. -R 1: NVLS's registered CTAs
(nvls.cc `ncclNvlsRegResourcesQuery`, coll_reg.cc) and NCCL_CTA_POLICY EFFICIENCY (enqueue.cc `ncclGetAlgoInfo`).
"""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.nccl.shape import wire_bytes
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized

KiB, MiB = 1 << 10, 1 << 20
GIB_US = (1 << 30) / 1e6  # NCCL's "GBps": bytes per µs of one GiB/s
H100 = dgx_host(gpu="h100")
RANKS = tuple(range(8))


def opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def choice(kind: str, nbytes: int, topo=H100, ranks=RANKS, dtype: str = "fp32", **env: str) -> dict:
    dag = decompose(Collective(kind, ranks, nbytes, dtype), topo, opts(**env))
    return dag.choice or {}


def hopper_time(bus_bytes: float, lat: float, ctas: int, sm_gib: float, mult: float, peak_gib: float) -> float:
    """queryModel's time (µs) on Hopper, written out: bw = softmin(ctas x smBw x mult, peak; softness smBw),
    time = lat + softplus(busBytes / bw - 1)."""
    sm, peak = sm_gib * GIB_US, peak_gib * GIB_US
    bw = peak - sm * math.log1p(math.expm1(peak / sm) * math.exp(-ctas * sm * mult / sm))
    x = bus_bytes / bw - 1
    return lat + (x if x >= 100 else math.log1p(math.exp(x)))


def fewest_ctas(bus_bytes: float, lat: float, most: int, sm: float, mult: float, peak: float) -> tuple[float, int]:
    """The fewest CTAs within 2.5 % of the most CTAs' time, and that time."""
    top = hopper_time(bus_bytes, lat, most, sm, mult, peak)
    for c in range(1, most):
        t = hopper_time(bus_bytes, lat, c, sm, mult, peak)
        if t <= 1.025 * top:
            return t, c
    return top, most


def ar_candidates(nbytes: int) -> dict[str, tuple[float, int]]:
    """8 H100s with NVLS: the all-reduce kernels' (time, CTAs), from queryModel's constants."""
    n = 8
    return {
        "AllReduce_AGxLL_R": fewest_ctas(n * nbytes * 9, 4.5, 64, 65, 1.0, 320),
        "AllReduce_AGxLLMC_R": fewest_ctas(n * nbytes * 9, 4.5, 64, 65, 1.1, 320),
        "AllReduce_RSxLD_AGxST": fewest_ctas(2 * nbytes * (n - 1) // n, 7.8, 64, 65, 1.0, 320),
        "AllReduce_RSxLDMC_AGxSTMC": fewest_ctas(nbytes // n + nbytes, 7.8, 2, 65, n, 480),  # divUp(16, 8) CTAs
    }


def best(cands: dict[str, tuple[float, int]]) -> str:
    return min(cands, key=lambda k: cands[k][0] * (1 + 0.025 * cands[k][1]))


@pytest.mark.parametrize(
    ("nbytes", "kernel"), [(16 * KiB, "AllReduce_AGxLLMC_R"), (17 * KiB, "AllReduce_RSxLDMC_AGxSTMC")]
)
def test_the_picker_flips_at_its_cost_models_boundary(nbytes, kernel):
    """8 H100s, fp32: LL multicast up to 16 KiB, NVLS load-reduce / multicast store from 17 KiB (2.5 % a CTA)."""
    cands = ar_candidates(nbytes)
    assert best(cands) == kernel
    got = choice("all_reduce", nbytes, PHANTORA_NCCL_REGISTER="2")
    t, ctas = cands[kernel]
    assert (got["algorithm"], got["kernel"], got["channels"]) == ("sym", kernel, ctas)
    assert got["model_time_us"] == pytest.approx(t, abs=1e-3)
    assert got["protocol"] == ("LL" if "LL" in kernel else "Simple")


def test_a_large_all_reduce_runs_nvls_on_two_ctas_at_the_models_time():
    """256 MiB: RSxLDMC_AGxSTMC on divUp(16, 8) = 2 CTAs (1 CTA is 6 % slower); time 7.8 + 1.125 S / bw(2) - 1.
    Its flows: GPU i -> i + 1, S (n + 1) / n each (the NVLS bytes), capped to end in that bandwidth time."""
    s = 256 * MiB
    sm, peak = 65 * GIB_US, 480 * GIB_US
    bw2 = peak - sm * math.log1p(math.expm1(peak / sm) * math.exp(-2 * 8))
    expect = 7.8 + (s // 8 + s) / bw2 - 1
    dag = decompose(Collective("all_reduce", RANKS, s, "fp32"), H100, opts(PHANTORA_NCCL_REGISTER="2"))
    c = dag.choice or {}
    assert (c["kernel"], c["channels"]) == ("AllReduce_RSxLDMC_AGxSTMC", 2)
    assert c["model_time_us"] == pytest.approx(expect, rel=1e-6)
    assert len(dag.flows) == 8 and {(f.src, f.dst) for f in dag.flows} == {(i, (i + 1) % 8) for i in range(8)}
    assert all(f.size == s * 9 // 8 for f in dag.flows)
    t_bw_ns = (s // 8 + s) / bw2 * 1000
    assert all(f.rate_bps == pytest.approx(f.size * 8e9 / t_bw_ns, rel=1e-6) for f in dag.flows)


def test_ll_kernels_put_twice_the_bytes_on_nvlink():
    """Without NVLS (NCCL_NVLS_ENABLE=0) a 1 KiB all-reduce runs AGxLL_R: every GPU stores the whole buffer into
    each peer in LL lines, 7 x 2 KiB out of each GPU; and the time is queryModel's."""
    env = {"PHANTORA_NCCL_REGISTER": "2", "NCCL_NVLS_ENABLE": "0"}
    dag = decompose(Collective("all_reduce", RANKS, KiB, "fp32"), H100, opts(**env))
    c = dag.choice or {}
    t, ctas = fewest_ctas(8 * KiB * 9, 4.5, 64, 65, 1.0, 320)
    assert (c["kernel"], c["protocol"], c["channels"]) == ("AllReduce_AGxLL_R", "LL", ctas)
    assert c["model_time_us"] == pytest.approx(t, abs=1e-3)
    assert len(dag.flows) == 56 and all(f.size == wire_bytes(KiB, "LL") == 2 * KiB for f in dag.flows)


def end_us(nbytes: int) -> float:
    dag = decompose(Collective("all_reduce", RANKS, nbytes, "fp32"), H100, opts(PHANTORA_NCCL_REGISTER="2"))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000


def test_simulated_time_is_the_kernels_model_time_or_the_nvlinks_on_an_idle_host():
    """On the flow engine a 16 KiB all-reduce (LL multicast, 7 x 32 KiB of LL lines into each GPU, far below the
    NVLink) ends at NCCL's estimate; a 64 KiB one (NVLS on 1 CTA, about 485 GB/s by the model) moves its
    S x 9 / 8 per GPU at the NVLink's 450 GB/s (18 x 25 GB/s), so it ends that much later than the estimate."""
    t16, _ = ar_candidates(16 * KiB)["AllReduce_AGxLLMC_R"]
    assert end_us(16 * KiB) == pytest.approx(t16, abs=0.005)
    t64, _ = ar_candidates(64 * KiB)["AllReduce_RSxLDMC_AGxSTMC"]
    sm, peak = 65 * GIB_US, 480 * GIB_US
    bw1 = peak - sm * math.log1p(math.expm1(peak / sm) * math.exp(-8))
    nvlink = 64 * KiB * 9 / 8 / 450e3  # µs at 450 GB/s
    assert end_us(64 * KiB) == pytest.approx(t64 - 64 * KiB * 9 / 8 / bw1 + nvlink, abs=0.005)


def test_reduce_scatter_without_a_float_type_and_the_versions_before_2_27_run_the_legacy_algorithms():
    assert choice("reduce_scatter", 8 * MiB, dtype="int32", PHANTORA_NCCL_REGISTER="2")["algorithm"] != "sym"
    assert choice("all_gather", 8 * MiB, dtype="int32", PHANTORA_NCCL_REGISTER="2")["algorithm"] == "sym"
    old = choice("all_reduce", 256 * MiB, PHANTORA_NCCL_REGISTER="2", PHANTORA_NCCL_VERSION="2.26")
    assert (old["algorithm"], old["channels"], old.get("registered")) == ("NVLS", 4, True)  # nccl-tests: -R 2 -> 1
    assert choice("all_reduce", 256 * MiB, PHANTORA_NCCL_REGISTER="2", NCCL_WIN_ENABLE="0")["algorithm"] == "NVLS"


def test_across_hosts_legacy_where_nccl_has_no_kernel_and_gin_where_it_has_one():
    """Across hosts all-reduce has no symmetric kernel, 2.28.3 no symmetric support; 2.30's all-gather runs its
    GIN kernel (tests/test_nccl_sym_gin.py)."""
    topo = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")
    ranks = tuple(range(16))
    assert choice("all_reduce", 8 * MiB, topo, ranks, PHANTORA_NCCL_REGISTER="2")["algorithm"] != "sym"  # 2.30
    old = choice("all_gather", 8 * MiB, topo, ranks, PHANTORA_NCCL_REGISTER="2", PHANTORA_NCCL_VERSION="2.28.3")
    assert old["algorithm"] != "sym"
    gin = choice("all_gather", 8 * MiB, topo, ranks, PHANTORA_NCCL_REGISTER="2")
    assert gin["kernel"] == "AllGather_RailRing_LsaSTMC"


def test_nccl_sym_kernel_and_sym_ctas_force_the_kernel_and_its_ctas():
    got = choice("all_reduce", 256 * MiB, PHANTORA_NCCL_REGISTER="2", NCCL_SYM_KERNEL="AllReduce_RSxLD_AGxST")
    assert (got["kernel"], got["channels"]) == (
        "AllReduce_RSxLD_AGxST",
        fewest_ctas(2 * 7 * 256 * MiB // 8, 7.8, 64, 65, 1, 320)[1],
    )
    got = choice("all_reduce", 256 * MiB, PHANTORA_NCCL_REGISTER="2", NCCL_SYM_CTAS="1")
    assert got["channels"] == 1
    assert got["model_time_us"] == pytest.approx(hopper_time(256 * MiB * 9 // 8, 7.8, 1, 65, 8, 480), rel=1e-6)
    with pytest.raises(InputError, match="NCCL_SYM_KERNEL"):
        choice("all_reduce", MiB, PHANTORA_NCCL_REGISTER="2", NCCL_SYM_KERNEL="AllReduce_Fast")


@pytest.mark.parametrize(("kind", "ctas"), [("all_reduce", 4), ("reduce_scatter", 5)])
def test_registered_nvls_runs_fewer_ctas_at_nccls_latency(kind, ctas):
    """-R 1: NVLS on registered buffers runs divUp(4 x 8, 8) = 4 CTAs (reduce-scatter divUp(5 x 8, 8) = 5) on 8
    H100s, NCCL's "to saturate bandwidth": its latency stays the unregistered NVLS's (its chunks and fill:
    tests/test_nccl_registered_nvls.py)."""
    plain = choice(kind, 256 * MiB, NCCL_ALGO="NVLS")
    reg = choice(kind, 256 * MiB, NCCL_ALGO="NVLS", PHANTORA_NCCL_REGISTER="1")
    assert (plain["channels"], reg["channels"], reg.get("registered")) == (16, ctas, True)
    assert reg["model_lat_us"] == plain["model_lat_us"]
    assert (
        choice(kind, 256 * MiB, NCCL_ALGO="NVLS", PHANTORA_NCCL_REGISTER="1", NCCL_LOCAL_REGISTER="0")["channels"] == 16
    )


def test_cta_policy_efficiency_sends_a_registered_all_gather_to_nvls():
    """NCCL_CTA_POLICY=1 with -R 1: a 1 MiB all-gather (ring LL on 24 channels by default) runs NVLS on 4 CTAs; a
    64 KiB one keeps its ring (2 channels < 4); without registration, or with NCCL_ALGO set, nothing changes."""
    assert choice("all_gather", MiB)["algorithm"] == "Ring"
    eff = choice("all_gather", MiB, PHANTORA_NCCL_REGISTER="1", NCCL_CTA_POLICY="1")
    assert (eff["algorithm"], eff["channels"]) == ("NVLS", 4)
    assert (
        choice("all_gather", 64 * KiB, PHANTORA_NCCL_REGISTER="1", NCCL_CTA_POLICY="EFFICIENCY")["algorithm"] == "Ring"
    )
    assert choice("all_gather", MiB, NCCL_CTA_POLICY="1")["algorithm"] == "Ring"
    assert (
        choice("all_gather", MiB, PHANTORA_NCCL_REGISTER="1", NCCL_CTA_POLICY="1", NCCL_ALGO="Ring,NVLS")["algorithm"]
        == "Ring"
    )
    assert (
        choice("all_gather", MiB, PHANTORA_NCCL_REGISTER="1", NCCL_CTA_POLICY="1", PHANTORA_NCCL_VERSION="2.26")[
            "algorithm"
        ]
        == "Ring"
    )


@pytest.mark.parametrize(("var", "value"), [("PHANTORA_NCCL_REGISTER", "3"), ("NCCL_CTA_POLICY", "FAST")])
def test_bad_values_are_one_line_errors_naming_the_variable(var, value):
    with pytest.raises(InputError, match=var):
        choice("all_reduce", MiB, **{var: value})


def test_a_large_all_gather_is_a_multicast_store_of_each_ranks_part():
    """64 MiB gathered (8 MiB a rank, bf16): AllGather_STMC on divUp(16, 8) = 2 CTAs, busBytes (n - 1) x 8 MiB at
    softmin(2 x 44 x 0.55 x 8, 320) GiB/s; flows GPU i -> i + 1 of 7 x 8 MiB (what each GPU receives)."""
    part = 8 * MiB
    expect = hopper_time(7 * part, 7.8, 2, 44, 0.55 * 8, 320)
    dag = decompose(Collective("all_gather", RANKS, 8 * part, "bf16"), H100, opts(PHANTORA_NCCL_REGISTER="2"))
    c = dag.choice or {}
    assert (c["kernel"], c["channels"]) == ("AllGather_STMC", 2)
    assert c["model_time_us"] == pytest.approx(expect, rel=1e-6)
    assert len(dag.flows) == 8 and all(f.size == 7 * part for f in dag.flows)


def _table(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    from phantora.cli import main

    assert main(["nccl-tests", *argv]) == 0
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#")]


def test_nccl_tests_r_and_x_run_what_they_register(capsys: pytest.CaptureFixture[str]) -> None:
    """`phantora nccl-tests -R 2` runs the symmetric kernel (its record in the line's comment), `-R 1 -x 1` a 1 MiB
    all-gather on NVLS's 4 registered CTAs, `-x 1` alone (nothing registered) NCCL's ring, as without it."""
    base = ["all_gather_perf", "-b", "1M", "-e", "1M", "-n", "2", "-w", "0"]
    sym = _table([*base, "-R", "2"], capsys)
    assert "algorithm=sym" in sym[0] and "kernel=AllGather_" in sym[0]
    eff = _table([*base, "-R", "1", "-x", "1"], capsys)
    assert "algorithm=NVLS" in eff[0] and "channels=4 " in eff[0] and "registered=True" in eff[0]
    plain, policy = _table(base, capsys), _table([*base, "-x", "1"], capsys)
    assert policy == plain and "algorithm=Ring" in plain[0]


def _p2p(nbytes: int, src: int, dst: int, topo=H100, comm: tuple[int, ...] = (), **env: str) -> dict:
    return decompose(Collective("send_recv", (src, dst), nbytes, "fp32", comm=comm), topo, opts(**env)).choice or {}


def test_registered_send_recv_is_zero_copy_where_nccl_registers_it_at_the_same_time():
    """-R 1 (2.24+): a Simple send inside a node over P2P is zero-copy (IPC), an LL one (<= 16 KiB a channel) is
    not; across nodes only without PXN (NET registration needs the sender's own NIC); NCCL's rating is unchanged."""
    reg = {"PHANTORA_NCCL_REGISTER": "1"}
    big, plain = _p2p(64 * MiB, 0, 1, **reg), _p2p(64 * MiB, 0, 1)
    assert big.get("registered") and big["protocol"] == "Simple" and not plain.get("registered")
    assert big["model_time_us"] == plain["model_time_us"]
    assert not _p2p(4 * KiB, 0, 1, **reg).get("registered")  # LL
    assert not _p2p(64 * MiB, 0, 1, **reg, PHANTORA_NCCL_VERSION="2.23").get("registered")
    two = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")
    world = tuple(range(16))
    assert not _p2p(64 * MiB, 0, 9, two, world, **reg).get("registered")  # 8 GPUs a host: PXN
    assert _p2p(64 * MiB, 0, 9, two, world, **reg, NCCL_PXN_DISABLE="1").get("registered")
    assert _p2p(64 * MiB, 0, 9, two, **reg).get("registered")  # a lone pair's communicator: one GPU a host


def test_results_count_each_symmetric_kernel_by_name():
    from phantora.collectives.nccl import summarize_choices

    small = decompose(Collective("all_reduce", RANKS, KiB, "fp32"), H100, opts(PHANTORA_NCCL_REGISTER="2"))
    large = decompose(Collective("all_reduce", RANKS, 64 * MiB, "fp32"), H100, opts(PHANTORA_NCCL_REGISTER="2"))
    recs = [{"kind": "all_reduce", "nccl": d.choice} for d in (small, large, large)]
    assert summarize_choices(recs, ())["choices"] == {
        "all_reduce": {"sym/LL/AllReduce_AGxLLMC_R": 1, "sym/Simple/AllReduce_RSxLDMC_AGxSTMC": 2}
    }


def test_results_count_an_all_to_alls_pairs_under_all_to_all():
    """NCCL runs an all-to-all as one group of sends and receives, recorded a pair at a time (kind `send_recv`, named
    `all_to_all#1@0.1`, as Megatron's alltoall token dispatcher's on EP 2): results.json counts the pairs under
    `all_to_all`, and a pipeline's own send (no `@`) under `send_recv`."""
    from phantora.collectives.nccl import summarize_choices

    simple, ll = {"algorithm": "p2p", "protocol": "Simple"}, {"algorithm": "p2p", "protocol": "LL"}
    recs = [{"kind": "send_recv", "name": "all_to_all#1@0.1", "nccl": simple}] * 2
    recs += [{"kind": "send_recv", "name": "all_to_all#2@0.1", "nccl": ll}, {"kind": "send_recv", "name": "send#0"}]
    recs[-1] = {**recs[-1], "nccl": simple}
    assert summarize_choices(recs, ())["choices"] == {
        "all_to_all": {"p2p/Simple": 2, "p2p/LL": 1},
        "send_recv": {"p2p/Simple": 1},
    }


def test_blackwell_takes_its_own_constants():
    """8 B200s without NVLS: AGxLL_R at Blackwell's baseLat 11 µs (an LL all-reduce), smBw 55 GiB/s, peak 600 GiB/s;
    and the multicast kernels' CTAs are at most divUp(32, 8) = 4 there (RSxLDMC_AGxSTMC at 256 MiB, peak 1000 GiB/s,
    baseLat 19.5 µs)."""
    b200 = dgx_host(gpu="b200")
    got = choice("all_reduce", KiB, b200, PHANTORA_NCCL_REGISTER="2", NCCL_NVLS_ENABLE="0")

    def bw(ctas: int, sm_gib: float, mult: float, peak_gib: float) -> float:
        sm, peak = sm_gib * GIB_US, peak_gib * GIB_US
        return peak - sm * math.log1p(math.expm1(peak / sm) * math.exp(-ctas * mult))

    def t(bus: float, lat: float, ctas: int, mult: float, peak: float) -> float:
        x = bus / bw(ctas, 55, mult, peak) - 1
        return lat + (x if x >= 100 else math.log1p(math.exp(x)))

    most = t(8 * KiB * 9, 11.0, 64, 1.0, 600)
    ctas = next(c for c in range(1, 65) if t(8 * KiB * 9, 11.0, c, 1.0, 600) <= 1.025 * most)
    assert (got["kernel"], got["channels"]) == ("AllReduce_AGxLL_R", ctas)
    assert got["model_time_us"] == pytest.approx(t(8 * KiB * 9, 11.0, ctas, 1.0, 600), abs=1e-3)
    big = choice("all_reduce", 256 * MiB, b200, PHANTORA_NCCL_REGISTER="2")
    s = 256 * MiB
    top = t(s // 8 + s, 19.5, 4, 8, 1000)  # at most divUp(32, 8) = 4 CTAs; 3 are within 2.5 % of it, 2 are not
    assert t(s // 8 + s, 19.5, 2, 8, 1000) > 1.025 * top >= t(s // 8 + s, 19.5, 3, 8, 1000)
    assert (big["kernel"], big["channels"]) == ("AllReduce_RSxLDMC_AGxSTMC", 3)
    assert big["model_time_us"] == pytest.approx(t(s // 8 + s, 19.5, 3, 8, 1000), rel=1e-6)


def test_a_program_registers_a_groups_buffers_by_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What stands for torch's registration (docs/collectives.md, "PyTorch"): PHANTORA_NCCL_REGISTER set by the
    program before it creates a group is that group's (runtime/program_env.py): FSDP2's set_symm_mem_for_comm is 2,
    a 64 MiB bf16 all-gather on 8 H100s running NCCL's multicast-store kernel on 2 CTAs; allocate_tensor's pool is 1,
    a 64 MiB NVLS all-reduce on its 4 registered CTAs."""
    from phantora.runtime import program_env

    monkeypatch.delenv("PHANTORA_NCCL_REGISTER", raising=False)
    monkeypatch.setenv("NCCL_ALGO", "NVLS")
    start = program_env.at_start()
    for mode, kind, want in (("2", "all_gather", ("sym", 2)), ("1", "all_reduce", ("NVLS", 4))):
        monkeypatch.setenv("PHANTORA_NCCL_REGISTER", mode)
        env = program_env.program_nccl_env(start)
        assert env is not None and dict(env)["PHANTORA_NCCL_REGISTER"] == mode
        got = decompose(Collective(kind, RANKS, 64 * MiB, "bf16"), H100, AlgoOptions(nccl_env=env)).choice or {}
        assert (got["algorithm"], got["channels"]) == want
