"""A live program's reductions reach NCCL's model (issue 33), checked against NCCL's rules as tests/test_nccl_redop.py
restates them (hostToDevRedOp, ncclNvlsSupported, ncclSymkImplemented).

One 8-rank CUDA + NCCL program on an 8-GPU H100 host (phantom tensors, one live process standing for the 8), with
PHANTORA_NCCL_REGISTER=2, doing SUM, AVG, MAX and PREMUL_SUM all-reduces and reduce-scatters in bf16, fp32 and int32,
then a functional max all-reduce and avg reduce-scatter (tests/scripts/reduce_ops.py), recorded: each call's choice is
the symmetric kernel for a float sum, else the legacy tuner's, NVLS for an all-reduce only where ncclNvlsSupported
takes the op and datatype; its recording replays to the same choices (results.json's counts equal, the symmetric
kernels' names too) and exports to Chakra with its reductions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_nccl_redop import H100, NO_NVLS, SIZE, choice, dev_op, nvls_takes

from phantora.egraph import load, replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import Coll
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator

SYM_FLOATS = {"fp32", "fp16", "bf16", "fp8"}  # ncclSymkImplemented: Sum on a float type other than double
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "reduce_ops.py")
PROGRAM_CALLS = [(op, d) for d in ("bf16", "fp32", "int32") for op in ("sum", "avg", "max")]
PROGRAM_CALLS += [("mulsum", "bf16"), ("mulsum", "fp32")]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    trace = tmp_path_factory.mktemp("redop") / "trace"
    cfg = RunConfig(SCRIPT, [str(SIZE)], H100, nproc=8, tensors="phantom", trace="none", dedup=1,
                    env={"PHANTORA_NCCL_REGISTER": "2"}, timeout_s=300)  # fmt: skip
    report, _ = record_run(cfg, trace)
    return report, trace


def test_a_live_runs_reductions_reach_nccls_choice(live: tuple[Any, Path]) -> None:
    """Each call's op and datatype as the program issued them (a functional max all-reduce and avg reduce-scatter
    last), and NCCL's choice for them with symmetric windows: the symmetric kernel for a float sum, else the
    legacy tuner's choice, NVLS for an all-reduce only where ncclNvlsSupported takes the op and datatype."""
    report, _ = live
    records = [c for c in report.cosim.collectives if c["kind"] in ("all_reduce", "reduce_scatter")]
    issued = [(k, op, d) for op, d in PROGRAM_CALLS for k in ("all_reduce", "reduce_scatter")]
    issued += [("all_reduce", "max", "fp32"), ("reduce_scatter", "avg", "fp32")]
    assert [(c["kind"], c.get("redop", "sum"), c["dtype"]) for c in records] == issued
    for rec, (kind, op, dtype) in zip(records, issued, strict=True):
        got = rec["nccl"]
        if dev_op(op, dtype) == "Sum" and dtype in SYM_FLOATS:
            assert got["algorithm"] == "sym", (kind, op, dtype)
            continue
        assert got["algorithm"] != "sym" and "kernel" not in got, (kind, op, dtype)
        nvls = kind == "all_reduce" and nvls_takes(op, dtype)
        want = choice(kind, dtype, "sum", **({} if nvls else {"NCCL_ALGO": NO_NVLS}))
        assert (got["algorithm"], got["protocol"], got["channels"]) == (
            want["algorithm"], want["protocol"], want["channels"]), (kind, op, dtype)  # fmt: skip
        assert (got["algorithm"] == "NVLS") == nvls, (kind, op, dtype)
    fp32_max = [c for c in records if (c["kind"], c.get("redop"), c["dtype"]) == ("all_reduce", "max", "fp32")]
    assert [c["nccl"]["algorithm"] for c in fp32_max] == ["Ring", "Ring"]  # NVLS reduces no fp32 max


def test_its_recording_replays_to_the_same_choices_and_exports_its_reductions(
    live: tuple[Any, Path], tmp_path: Path
) -> None:
    report, trace = live
    graph = load(trace)
    ops = [n.redop for n in graph.programs[0].nodes if isinstance(n, Coll)]
    assert ops == [op for op, _ in PROGRAM_CALLS for _ in range(2)] + ["max", "avg"]
    replayed = replay_graph(graph, H100, FlowSimulator(H100))
    live_counts = report.summary["nccl"]["choices"]  # results.json's: the symmetric kernels named
    assert any(key.startswith("sym/") and key.count("/") == 2 for per in live_counts.values() for key in per)
    assert replayed.nccl == live_counts
    export_chakra(graph, tmp_path / "et")
    back = read_chakra(tmp_path / "et")
    assert [n.redop for n in back.programs[0].nodes if isinstance(n, Coll)] == ops
