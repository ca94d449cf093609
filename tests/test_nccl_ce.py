"""NCCL's copy-engine collectives (NCCL_CTA_POLICY ZERO with symmetric windows, `-x 2 -R 2`) against closed forms
restated from NCCL's code (src/ce_coll.cc and enqueue.cc `taskAppend`, v2.28.3-1 .. v2.30.7-1), not read back from
the code under test:

- where NCCL runs one: the ZERO policy (2.28+) on symmetric windows, all-gather or all-to-all, one node; from
  2.29.2 also a Blackwell all-gather of more than NCCL_SYM_CE_THRESHOLD = 8 Mi elements a rank (`info->count >
  ncclParamSymCeThreshold()`), with or without the policy;
- what it moves: each GPU writes its part (S / n) to each of its n - 1 peers (`ncclCeAllGather`: one copy a peer),
  an all-to-all its block for each peer (`ncclCeAlltoAll`);
- its syncs: one before and one after the batch (`ncclMemOpSync`), and under 2.28.x one between batches of 8
  copies (CE_COLL_INTRA_BATCH_SYNC_FREQ) once a batch of more than 8 copies holds 512 MiB or more
  (CE_COLL_INTRA_BATCH_SYNC_MSG_THRESHOLD); each sync charged NCCL's NVLink Simple hop, hwLat 3.4 µs.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized

MiB = 1 << 20
H100 = dgx_host(gpu="h100")
B200 = dgx_host(gpu="b200")
RANKS = tuple(range(8))
SYNC_US = 3.4  # tuning.cc hwLat[NCCL_HW_NVLINK][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]
ZERO = {"PHANTORA_NCCL_REGISTER": "2", "NCCL_CTA_POLICY": "2"}


def dag_of(kind: str, nbytes: int, topo=H100, ranks=RANKS, dtype: str = "fp32", api: bool = True, **env: str):
    """`api`: an all-to-all as the ncclAlltoAll call (nccl-tests 2.28+), not a group of sends and receives."""
    coll = Collective(kind, ranks, nbytes, dtype, alltoall_api=api and kind == "all_to_all")
    return decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))


def algo(kind: str, nbytes: int, topo=H100, ranks=RANKS, dtype: str = "fp32", **env: str) -> str:
    return str((dag_of(kind, nbytes, topo, ranks, dtype, **env).choice or {}).get("algorithm"))


@pytest.mark.parametrize("kind", ["all_gather", "all_to_all"])
def test_zero_policy_on_windows_runs_the_copy_engines_with_no_cta(kind: str) -> None:
    c = dag_of(kind, 4 * MiB, **ZERO).choice or {}
    assert (c["algorithm"], c["channels"], c["ce_syncs"]) == ("ce", 0, 2)
    assert c["model_lat_us"] == pytest.approx(2 * SYNC_US)


@pytest.mark.parametrize(
    ("kind", "env", "ce"),
    [
        ("all_gather", {"PHANTORA_NCCL_REGISTER": "2"}, False),  # no policy: a symmetric kernel (Hopper)
        ("all_gather", {"PHANTORA_NCCL_REGISTER": "1", "NCCL_CTA_POLICY": "2"}, False),  # no window
        ("all_gather", {**ZERO, "NCCL_WIN_ENABLE": "0"}, False),  # no symmetric support
        ("all_gather", {**ZERO, "NCCL_CTA_POLICY": "1"}, False),  # EFFICIENCY is not ZERO
        ("all_gather", {**ZERO, "PHANTORA_NCCL_VERSION": "2.27"}, False),  # ce_coll.cc came in 2.28
        ("all_gather", {**ZERO, "PHANTORA_NCCL_VERSION": "2.28.3"}, True),
        ("all_gather", {**ZERO, "NCCL_CTA_POLICY": "EFFICIENCY|ZERO"}, True),  # 2.29.2+: the ZERO bit
        ("all_gather", {**ZERO, "NCCL_ALGO": "Ring"}, True),  # taskAppend runs before the tuner
        ("all_reduce", ZERO, False),  # ncclCeImplemented: all-gather, all-to-all, scatter, gather
        ("reduce_scatter", ZERO, False),
    ],
)
def test_where_nccl_runs_the_copy_engines(kind: str, env: dict[str, str], ce: bool) -> None:
    assert (algo(kind, 4 * MiB, **env) == "ce") is ce


def test_torchs_all_to_all_is_a_send_recv_group_which_never_takes_the_copy_engines() -> None:
    """ProcessGroupNCCL runs all_to_all_single as ncclGroupStart, an ncclSend and an ncclRecv a peer (ncclAllToAll
    only with NCCLX's NCCL_ALLTOALL_SUPPORTED): NCCL's p2p tasks, not taskAppend's ncclFuncAlltoAll."""
    assert (dag_of("all_to_all", 4 * MiB, api=False, **ZERO).choice or {})["algorithm"] == "p2p"


def test_blackwell_all_gather_takes_the_copy_engines_above_8_mi_elements_a_rank() -> None:
    """2.29.2+ (enqueue.cc): on SM100+ with every GPU on a direct NVLink, a symmetric all-gather whose count (a
    rank's elements) is more than 8 Mi runs on the copy engines without the ZERO policy; int8: 8 Mi bytes a rank."""
    at = 8 * (8 * MiB)  # 8 ranks x 8 Mi one-byte elements: count == threshold
    reg = {"PHANTORA_NCCL_REGISTER": "2"}
    assert algo("all_gather", at, B200, dtype="int8", **reg) == "sym"
    assert algo("all_gather", at + 8, B200, dtype="int8", **reg) == "ce"
    assert algo("all_gather", at + 8, B200, dtype="fp32", **reg) == "sym"  # 2 Mi + 2 fp32 elements a rank
    assert algo("all_gather", at + 8, B200, dtype="int8", NCCL_SYM_CE_THRESHOLD=str(16 * MiB), **reg) == "sym"
    assert algo("all_gather", at + 8, B200, dtype="int8", PHANTORA_NCCL_VERSION="2.28", **reg) == "sym"
    assert algo("all_gather", at + 8, H100, dtype="int8", **reg) == "sym"  # Hopper: minCompCap < 100
    assert algo("all_to_all", at + 8, B200, dtype="int8", **reg) == "p2p"  # the automatic path is all-gather's


@pytest.mark.parametrize("kind", ["all_gather", "all_to_all"])
def test_each_gpu_writes_its_part_to_every_peer(kind: str) -> None:
    """n (n - 1) copies of S / n: each GPU sends and receives (n - 1) S / n over its NVLink."""
    nbytes = 64 * MiB
    flows = dag_of(kind, nbytes, **ZERO).flows
    assert sorted((f.src, f.dst) for f in flows) == sorted(
        (H100.node_of_rank(i), H100.node_of_rank(j)) for i in RANKS for j in RANKS if i != j
    )
    assert all(f.size == nbytes // 8 for f in flows)
    assert all(f.rate_bps == 0 for f in flows)  # no copy-engine rate in NCCL's code: the NVLink binds


def test_an_idle_host_ends_after_the_syncs_and_the_nvlinks_transfer() -> None:
    """64 MiB gathered on 8 H100s (NVLink 450 GB/s each way): 2 x 3.4 µs, then 7 x 8 MiB out of each GPU."""
    dag = dag_of("all_gather", 64 * MiB, **ZERO)
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    end_us = max(c.end_ns for c in sim.drain()) / 1000
    assert end_us == pytest.approx(2 * SYNC_US + 7 * 8 * MiB / 450e3, rel=0.01)


@pytest.mark.parametrize(
    ("version", "part", "syncs"), [("2.28", 32 * MiB, 3), ("2.28", 32 * MiB - 1, 2), ("2.29.2", 32 * MiB, 2)]
)
def test_a_cut_batch_syncs_between_batches_of_8_under_2_28(version: str, part: int, syncs: int) -> None:
    """16 GPUs on one NVSwitch: 16 copies a rank (its own and 15 peers); 16 x part >= 512 MiB cuts the batch, in
    2.28.x into 2 batches of 8 with one sync between (3 in all), from 2.29.2 into rounds of one batch (2)."""
    host = dgx_host(16, gpu="h100")
    c = dag_of("all_gather", 16 * part, host, tuple(range(16)), "int8", PHANTORA_NCCL_VERSION=version, **ZERO).choice
    assert c is not None and (c["algorithm"], c["ce_syncs"]) == ("ce", syncs)
    assert c["model_lat_us"] == pytest.approx(syncs * SYNC_US)


def test_across_hosts_nccl_runs_no_copy_engine_before_2_30_7_and_its_hierarchical_one_from_it() -> None:
    """The hierarchical CE's eligibility, flows and times: tests/test_nccl_hier_ce.py."""
    rail = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")
    ranks = tuple(range(16))
    assert algo("all_gather", 16 * MiB, rail, ranks, PHANTORA_NCCL_VERSION="2.30.4", **ZERO) != "ce"
    assert algo("all_gather", 16 * MiB, rail, ranks, PHANTORA_NCCL_VERSION="2.30.7", **ZERO) == "ce"


def test_nccl_tests_x_2_r_2_prints_the_copy_engine_choice(capsys: pytest.CaptureFixture[str]) -> None:
    from phantora.cli import main

    for version in ("2.28.3", "2.30"):  # -x 2 reaches 2.28's integer NCCL_CTA_POLICY too
        argv = ["nccl-tests", "all_gather_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0", "-x", "2", "-R", "2"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PHANTORA_NCCL_VERSION", version)
            assert main(argv) == 0
        rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#")]
        assert len(rows) == 1 and "algorithm=ce " in rows[0] and "channels=0 " in rows[0], version


@pytest.mark.slow
@pytest.mark.ns3
def test_packet_mode_carries_the_copy_engines_bytes_and_times_as_the_flow_network(ns3_lib) -> None:
    """all_gather_perf -x 2 -R 2 at 64 MiB through ns-3 on one 8-GPU H100 host: ns-3 delivers the copies' bytes,
    7 x 8 x 8 MiB (no protocol lines: the copy engines write the data), and ends no sooner than the flow network at
    the packets' goodput (`flow_goodput`: a fluid bound) and within 5% of it (2026-12-01: 149.83 against 143.55 µs,
    each GPU's NVLink port taking 7 peers' packets at once)."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.report import nccl_tests as nt

    topo = H100
    test = nt.find_test("all_gather_perf")
    nbytes = nt.counts(test, 64 * MiB, 4, 8)[2]
    it = nt.build_iteration(test, RANKS, nbytes, "fp32", 0, topo, AlgoOptions(nccl_env=nccl_env(ZERO)), 0, "t")
    assert it.choice is not None and it.choice["algorithm"] == "ce"
    wire = sum(f.size for f in it.flows)
    assert wire == 7 * 8 * 8 * MiB
    ns3 = make_engine(EngineSpec(network="ns3"), topo)
    goodput = make_engine(EngineSpec(network="flow", flow_goodput=True), topo)
    t_ns3 = nt.run_iteration(ns3, it)
    assert int(str(ns3.stats()["payload_bytes_delivered"])) == wire
    t_flow = nt.run_iteration(goodput, it)
    assert t_flow <= t_ns3 <= 1.05 * t_flow


@pytest.mark.parametrize(
    ("version", "policy", "ok"), [("2.28.3", "3", False), ("2.30", "3", True), ("2.30", "4", False)]
)
def test_nccl_tests_x_above_the_valid_policies_fails_the_init(
    version: str, policy: str, ok: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """nccl-tests passes -x as the communicators' config.CTAPolicy, which init.cc's parseCommConfig refuses above
    NCCL_CTA_POLICY_ZERO (2.28.x) or above the OR of the policies, 3 (2.29.2+'s ctaPolicyIsValid):
    ncclInvalidArgument. 3 on 2.29.2+ is EFFICIENCY|ZERO, ZERO kept: the copy engines."""
    from phantora.cli import main

    argv = ["nccl-tests", "all_gather_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0", "-x", policy, "-R", "2"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PHANTORA_NCCL_VERSION", version)
        rc = main(argv)
    got = capsys.readouterr()
    if ok:
        assert rc == 0 and "algorithm=ce " in got.out
    else:
        err = got.err.strip().splitlines()
        assert rc != 0 and len(err) == 1 and "'-x'" in err[0] and "Invalid config policy attribute value" in err[0]
