"""-R 2 with a reduction other than sum: NCCL has no symmetric kernel for it and runs its legacy algorithms.

NCCL's ncclSymkImplemented (src/sym_kernels.cc v2.28.3-1 .. v2.30.7-1, ncclSymImplemented in 2.27's symmetric.cc)
takes an all-reduce or reduce-scatter only with ncclDevSum (2.30: or ncclDevSumPostDiv, which enqueue.cc makes of
ncclAvg on integer types only; ncclAvg on floats and nccl-tests' mulsum are ncclDevPreMulSum) on a float type other
than double; prod, max and min are none of these. An all-gather takes any op (it reduces nothing).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host

MiB = 1 << 20
H100 = dgx_host(gpu="h100")
RANKS = tuple(range(8))


def _choice(kind: str, redop: str, register: str) -> dict:
    opts = AlgoOptions(nccl_env=nccl_env({"PHANTORA_NCCL_REGISTER": register}))
    return decompose(Collective(kind, RANKS, MiB, "fp32", redop=redop), H100, opts).choice or {}


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("redop", ["prod", "max", "min", "avg", "mulsum"])
def test_no_symmetric_kernel_for_other_reductions(kind: str, redop: str) -> None:
    """A 1 MiB float all-reduce / reduce-scatter on 8 H100s with symmetric windows: a sum runs NCCL's multicast
    kernel; any other reduction NCCL's legacy choice, the one it makes without registration."""
    summed = _choice(kind, "sum", "2")
    assert summed["algorithm"] == "sym" and summed["kernel"] in ("AllReduce_RSxLDMC_AGxSTMC", "ReduceScatter_LDMC")
    got = _choice(kind, redop, "2")
    assert got["algorithm"] != "sym" and "kernel" not in got
    assert got == _choice(kind, redop, "0")


def test_all_gather_ignores_the_op() -> None:
    """An all-gather reduces nothing: its symmetric kernel runs whatever op the caller names."""
    assert _choice("all_gather", "max", "2")["kernel"] == "AllGather_STMC"


def test_nccl_tests_o_all_with_r2(capsys: pytest.CaptureFixture[str]) -> None:
    """`phantora nccl-tests all_reduce_perf -R 2 -o all`: the sum block runs the symmetric kernel, the other five
    NCCL's ring (as without -R at 1 MiB on 8 H100s)."""
    from phantora.cli import main

    argv = ["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0", "-R", "2", "-o", "all"]
    assert main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#")]
    by_op = {ln.split()[3]: ln.partition("#")[2] for ln in lines}
    assert set(by_op) == {"sum", "prod", "max", "min", "avg", "mulsum"}
    assert "kernel=AllReduce_RSxLDMC_AGxSTMC" in by_op["sum"]
    assert all("algorithm=Ring" in by_op[op] and "kernel=" not in by_op[op] for op in by_op if op != "sum")
