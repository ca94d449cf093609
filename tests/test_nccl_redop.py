"""A collective's reduction as NCCL runs it (issue 33), against NCCL's own rules, restated here from its source:

- enqueue.cc `hostToDevRedOp` (v2.17.1-1 .. v2.30.7-1): sum -> Sum, prod -> Prod, max / min -> MinMax, avg ->
  SumPostDiv on integer types and PreMulSum on floating ones, mulsum (ncclRedOpCreatePreMulSum, torch's PREMUL_SUM)
  -> PreMulSum.
- `ncclNvlsSupported` (src/include/device.h v2.19.1-1 .. v2.30.7-1; the same table as NCCL_NVLS_SUPPORTS in
  collectives.h 2.17 / 2.18): Sum or MinMax on int32, uint32, int64, uint64, half, bfloat16; Sum alone on float and
  double; nothing else. The tuner skips NVLS and NVLS-Tree where it fails; an all-gather (op Sum) is exempt in 2.19
  and from 2.22 on, and is checked by its datatype in 2.17, 2.18, 2.20 and 2.21.
- enqueue.cc 2.23 - 2.30: no PAT for a reduce-scatter with PreMulSum or SumPostDiv ("Tree reduceScatter doesn't
  support scaling yet").
- `ncclSymkImplemented` (sym_kernels.cc 2.28 - 2.30; symmetric.cc 2.27): an all-reduce or reduce-scatter only with
  Sum on a float type other than double.
A PreMulSum or SumPostDiv runs in the sum's pass (the scale or the division is folded into it): NCCL's cost model
rates every op alike, so an op only removes algorithms from the choice.

A live program's reductions: tests/test_nccl_redop_live.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgpack
import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.egraph.format import Coll, Program
from phantora.errors import InputError
from phantora.topology import dgx_host, rail_optimized

MiB = 1 << 20
SIZE = 64 * MiB  # NCCL's tuner picks NVLS for an 8-GPU H100 all-reduce of this size (a sum)
H100 = dgx_host(gpu="h100")
RANKS = tuple(range(8))
OPS = ("sum", "prod", "max", "min", "avg", "mulsum")
INTS = ("int8", "uint8", "int32", "int64")
NVLS_TAKES = {"Sum": {"int32", "int64", "fp16", "bf16", "fp32", "fp64"}, "MinMax": {"int32", "int64", "fp16", "bf16"}}
NO_NVLS = "^NVLS,NVLSTree"  # NCCL_ALGO without NVLS and NVLS-Tree


def dev_op(op: str, dtype: str) -> str:
    if op == "avg":
        return "SumPostDiv" if dtype in INTS else "PreMulSum"
    return {"sum": "Sum", "prod": "Prod", "max": "MinMax", "min": "MinMax", "mulsum": "PreMulSum"}[op]


def nvls_takes(op: str, dtype: str) -> bool:
    return dtype in NVLS_TAKES.get(dev_op(op, dtype), set())


def choice(kind: str, dtype: str, op: str, topo=H100, ranks=RANKS, nbytes: int = SIZE, **env: str) -> dict:
    coll = Collective(kind, ranks, nbytes, dtype, redop=op)
    return decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env))).choice or {}


def test_an_all_reduce_runs_nvls_only_for_the_ops_and_types_nccl_takes() -> None:
    """64 MiB on 8 H100s: NVLS for every (op, datatype) ncclNvlsSupported takes, as for a sum; for any other the
    choice NCCL makes without NVLS, at the sum's cost (the op only removes algorithms)."""
    assert choice("all_reduce", "bf16", "sum")["algorithm"] == "NVLS"
    types = ("bf16", "fp16", "fp32", "fp64", "int8", "uint8", "int32", "int64", "fp8")
    for op, dtype in itertools.product(OPS, types):
        got = choice("all_reduce", dtype, op)
        if nvls_takes(op, dtype):
            assert got["algorithm"] == "NVLS", (op, dtype)
        else:
            assert got == choice("all_reduce", dtype, "sum", NCCL_ALGO=NO_NVLS), (op, dtype)
            assert got["algorithm"] not in ("NVLS", "NVLSTree"), (op, dtype)


def test_across_hosts_nvls_tree_only_for_the_ops_nccl_takes() -> None:
    """Two 8-GPU H100 hosts, 128 MiB: NVLS-Tree for a bf16 sum or max, not for an fp32 max or a bf16 average."""
    two, ranks = rail_optimized(2, 8, gpu="h100"), tuple(range(16))
    nbytes = 128 * MiB
    for dtype, op in (("bf16", "sum"), ("bf16", "max"), ("fp32", "sum")):
        assert choice("all_reduce", dtype, op, two, ranks, nbytes)["algorithm"] == "NVLSTree", (dtype, op)
    for dtype, op in (("fp32", "max"), ("bf16", "avg"), ("bf16", "mulsum"), ("int32", "prod")):
        got = choice("all_reduce", dtype, op, two, ranks, nbytes)
        assert got == choice("all_reduce", dtype, "sum", two, ranks, nbytes, NCCL_ALGO=NO_NVLS), (dtype, op)


@pytest.mark.parametrize("version", ["2.17", "2.19", "2.20", "2.21", "2.22", "2.30"])
def test_an_int8_all_gather_is_checked_by_its_datatype_where_nccl_checks_it(version: str) -> None:
    """NCCL_ALGO=NVLS all-gather of int8 (no NVLS Sum on int8): NCCL 2.19 and 2.22+ exempt an all-gather and run it,
    2.17, 2.20 and 2.21 skip NVLS and fail ("no algorithm"); a bf16 one runs NVLS in all of them."""
    env = {"NCCL_ALGO": "NVLS", "PHANTORA_NCCL_VERSION": version}
    assert choice("all_gather", "bf16", "sum", **env)["algorithm"] == "NVLS"
    if version in ("2.19", "2.22", "2.30"):
        assert choice("all_gather", "int8", "sum", **env)["algorithm"] == "NVLS"
    else:
        with pytest.raises(InputError) as err:
            choice("all_gather", "int8", "sum", **env)
        assert err.value.field == "NCCL_ALGO" and "no NVLS for sum on int8" in str(err.value)


@pytest.mark.parametrize("op,dtype", [("sum", "fp32"), ("max", "fp32"), ("avg", "fp32"), ("avg", "int32"),
                                      ("mulsum", "bf16"), ("prod", "int32")])  # fmt: skip
def test_pat_reduce_scatters_no_scaled_sum(op: str, dtype: str) -> None:
    """One GPU per node (PAT's ground), NCCL_ALGO=PAT: a reduce-scatter with PreMulSum or SumPostDiv has no PAT and
    NCCL fails; any other op runs PAT. Unforced, a scaled sum takes what a sum takes without PAT."""
    one, ranks = rail_optimized(4, 1, gpu="h100"), tuple(range(4))
    scaled = dev_op(op, dtype) in ("PreMulSum", "SumPostDiv")
    if scaled:
        with pytest.raises(InputError) as err:
            choice("reduce_scatter", dtype, op, one, ranks, NCCL_ALGO="PAT")
        assert err.value.field == "NCCL_ALGO" and f"no PAT for {op} on {dtype}" in str(err.value)
    else:
        assert choice("reduce_scatter", dtype, op, one, ranks, NCCL_ALGO="PAT")["algorithm"] == "PAT"
    for nbytes in (64 * 1024, SIZE):
        got = choice("reduce_scatter", dtype, op, one, ranks, nbytes)
        want = choice("reduce_scatter", dtype, "sum", one, ranks, nbytes, **({"NCCL_ALGO": "^PAT"} if scaled else {}))
        assert got == want, (op, dtype, nbytes)


def test_fp8_rings_over_more_than_8_ranks_are_least_preferred_from_2_24() -> None:
    """enqueue.cc 2.24 - 2.30 multiplies a ring's time by 1024 for an fp8 call over more than 8 ranks: on 2 x 8 H100s a
    256 MiB fp8 all-reduce runs what NCCL_ALGO=^Ring leaves (2.23: the ring); a broadcast, ring only, keeps it, as
    does an all-reduce on one host's 8."""
    two, ranks, nbytes = rail_optimized(2, 8, gpu="h100"), tuple(range(16)), 256 * MiB
    new = choice("all_reduce", "fp8", "sum", two, ranks, nbytes)
    assert new == choice("all_reduce", "fp8", "sum", two, ranks, nbytes, NCCL_ALGO="^Ring")
    assert new["algorithm"] != "Ring"
    old = choice("all_reduce", "fp8", "sum", two, ranks, nbytes, PHANTORA_NCCL_VERSION="2.23")
    assert old["algorithm"] == "Ring"
    coll = Collective("broadcast", ranks, nbytes, "fp8", root=0)
    assert (decompose(coll, two, AlgoOptions(nccl_env=nccl_env({}))).choice or {})["algorithm"] == "Ring"
    assert choice("all_reduce", "fp8", "sum")["algorithm"] == "Ring"  # 8 ranks: no penalty, and no NVLS for fp8


def test_a_workload_names_its_reductions() -> None:
    """A workload op's `redop` (docs/workload.md; a default applies to the reducing ops only) is its collective's:
    on 8 H100s a 64 MiB fp32 all-reduce with max is planned without NVLS, a sum with it."""
    from phantora.replay import plan_workload
    from phantora.workload import workload_from_dict

    ops = [{"name": "s", "kind": "all_reduce", "redop": "sum"}, {"name": "m", "kind": "all_reduce"},
           {"name": "g", "kind": "all_gather"}]  # fmt: skip
    data = {"defaults": {"bytes": SIZE, "dtype": "fp32", "redop": "max"}, "op": ops}
    wl = workload_from_dict(data, world=8)
    assert [op.coll.redop for op in wl.ops] == ["sum", "max", "sum"]
    plan = plan_workload(wl, H100)
    assert (plan.op_choice["s"]["algorithm"], plan.op_choice["m"]["algorithm"]) == ("NVLS", "Ring")
    with pytest.raises(InputError) as err:
        workload_from_dict({"op": [{"kind": "broadcast", "redop": "max", "root": 0}]}, world=8)
    assert err.value.field == "redop"


def test_an_unknown_reduction_is_a_one_line_error() -> None:
    with pytest.raises(InputError) as err:
        Collective("all_reduce", RANKS, MiB, "fp32", redop="xor")
    assert err.value.field == "redop" and "\n" not in str(err.value)


def test_recordings_keep_the_reduction_and_old_ones_load_as_sum(tmp_path: Path) -> None:
    """A Coll with a reduction other than sum is node type 10 (type 5's fields, then the op); a sum is still type 1
    or 5, byte for byte what recordings made before reductions were recorded hold, which load as sums."""
    old = [[1, 0, 0, 0, 1024, 2, -1, 0], [5, 0, 0, 2, 1024, 2, -1, 1, [0]]]  # all_reduce, reduce_scatter of fp32
    prog = Program.decode(msgpack.packb({"v": 1, "names": [], "nodes": old}))
    assert [n.redop for n in prog.nodes if isinstance(n, Coll)] == ["sum", "sum"]
    assert msgpack.unpackb(prog.encode())["nodes"] == old
    maxed = Program([Coll(0, 0, "all_reduce", 1024, "fp32", None, 0, redop="max")])
    rows = msgpack.unpackb(maxed.encode())["nodes"]
    assert rows == [[10, 0, 0, 0, 1024, 2, -1, 0, [], 2]]  # op code 2: max
    assert Program.decode(maxed.encode()) == maxed
    for bad, what in (([10, 0, 0, 0, 1024, 2, -1, 0, [], 99], "reduction code"),
                      ([10, 0, 0, 1, 1024, 2, -1, 0, [], 2], "takes no reduction")):  # fmt: skip
        with pytest.raises(InputError) as err:
            Program.decode(msgpack.packb({"v": 1, "names": [], "nodes": [bad]}), source="p.msgpack")
        assert what in str(err.value) and err.value.field == "nodes[0]"


def _coll(h: Any, rank: int, kind: str = "all_reduce", **extra: Any) -> None:
    h.handles[rank] += 1
    h.msg(rank, "coll", 0, h=h.handles[rank], group=[0, 1], seq=0, kind=kind, nbytes=MiB, dtype="fp32", root=None,
          name="", algo=None, **extra)  # fmt: skip


def test_the_coordinator_keeps_the_reduction_and_refuses_a_bad_one() -> None:
    """The `coll` message's `redop` (absent: sum) reaches the matched call's record; ranks that disagree stop the run
    naming it; a reduction on a collective that reduces nothing, or one NCCL has no name for, is a protocol error."""
    from test_bridge_core import Harness

    from bridge.errors import RunFailed

    h = Harness(world=2)
    _coll(h, 0, redop="max")
    _coll(h, 1, redop="max")
    h.wait(0, 0, 1)
    h.wait(1, 0, 1)
    h.core.progress()
    (rec,) = h.core.records
    assert rec.to_dict()["redop"] == "max" and rec.choice is not None
    h = Harness(world=2)
    _coll(h, 0)
    assert "op=" not in h.core.matcher.pending[("coll", (0, 1), 0, 0)].calls[0].describe()  # a sum says nothing
    with pytest.raises(RunFailed) as err:
        _coll(h, 1, redop="avg")
    assert err.value.code == "mismatch" and "reduction" in err.value.text and "op=avg" in err.value.text
    for kind, op in (("all_gather", "max"), ("all_reduce", "xor")):
        with pytest.raises(RunFailed) as err:
            _coll(Harness(world=2), 0, kind=kind, redop=op)
        assert err.value.code == "protocol" and f"bad reduction '{op}'" in err.value.text


@pytest.mark.parametrize("kernel,op", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "sum"),
    ("ncclDevKernel_AllReduce_MinMax_f32_RING_LL", "max"),  # 2.19+: max and min are one kernel
    ("ncclDevKernel_AllReduce_PreMulSum_f32_RING_LL", "mulsum"),  # an average of floats runs it too
    ("ncclKernel_AllReduce_RING_LL_Min_float", "min"),  # before 2.19: its own kernel, the op after the protocol
    ("ncclDevKernel_Generic_1", "sum"),  # no op in the name
])  # fmt: skip
def test_a_profiler_trace_gives_its_kernels_reduction(tmp_path: Path, kernel: str, op: str) -> None:
    """A PyTorch profiler trace names NCCL's device op in the kernel (NCCL's generate.py `all_redops`: Sum, Prod,
    MinMax, PreMulSum, SumPostDiv; collectives.h's ncclKernel_<func>_<algo>_<proto>_<op>_<type> before 2.19)."""
    from test_egraph_kineto import rank_trace, write

    from phantora.egraph.kineto import import_kineto

    traces = [rank_trace(r, 200) for r in range(2)]
    for t in traces:
        for ev in t["traceEvents"]:
            if ev["name"].startswith("ncclDevKernel"):
                ev["name"] = f"{kernel}(ncclDevComm*, unsigned long, ncclWork*)"
    graph, _ = import_kineto(write(tmp_path, traces), gaps="drop")
    assert [n.redop for n in graph.program_of(0).nodes if isinstance(n, Coll)] == [op]
