"""NCCL's reduction ops as its device runs them, and the algorithms that take them and a call's datatype (NCCL
2.17 - 2.30).

`dev_op` restates enqueue.cc `hostToDevRedOp`: sum -> Sum, prod -> Prod, max and min -> MinMax (one kernel, an xor
mask picks which), avg -> SumPostDiv on integer types and PreMulSum (a sum of inputs scaled by 1/nranks) on floating
types, and nccl-tests' mulsum (torch's PREMUL_SUM, ncclRedOpCreatePreMulSum) -> PreMulSum. The device folds the scale
or the division into the same pass as the sum, so a PreMulSum or SumPostDiv costs what a sum costs; what changes is
which algorithms NCCL lets run it (`skipped`):
- NVLS and NVLS-Tree only where `ncclNvlsSupported(devOp, datatype)` holds (src/include/device.h 2.19 - 2.30, the
  macro NCCL_NVLS_SUPPORTS in src/include/collectives.h 2.17 - 2.18, the same table): Sum or MinMax on int32, uint32,
  int64, uint64, half and bfloat16, Sum alone on float and double, nothing on int8, uint8 or fp8. The switch's
  multimem reduction does no product and no scaled sum. An all-gather (op Sum) is exempt in 2.19 and from 2.22 on;
  2.17, 2.18, 2.20 and 2.21 check its datatype too.
- PAT for a reduce-scatter not with PreMulSum or SumPostDiv (enqueue.cc 2.23 - 2.30: "Tree reduceScatter doesn't
  support scaling yet").
NCCL's symmetric kernels take a float sum only (`_sym_op` in `__init__.py`, `sym_kernels.REDUCING_FLOATS`).
From 2.24 the tuner also multiplies a ring's time by 1024 for an fp8 call over more than 8 ranks ("Relegate fp8
reduction trees of sufficient depth that they incur precision loss to be least preferred", any function):
`least_preferred`, the ring then runs only where nothing else may.

torch's BAND, BOR and BXOR have no NCCL op (ProcessGroupNCCL refuses them); phantora's process group also stands for
gloo's CPU half and runs them, modelled as NCCL's legacy algorithms would run an op the switch cannot reduce.
"""

from __future__ import annotations

INTEGERS = ("int8", "uint8", "bool", "int16", "int32", "int64")  # bool is NCCL's uint8 (torch maps it)
NVLS_MINMAX = ("int32", "int64", "fp16", "bf16")  # ncclNvlsSupported: Sum or MinMax (uint32/uint64 are int32/int64)
NVLS_SUM = ("fp32", "fp64")  # Sum only
_DEV = {"sum": "Sum", "prod": "Prod", "max": "MinMax", "min": "MinMax", "mulsum": "PreMulSum"}
ALL_GATHER_EXEMPT = ((2, 19), (2, 22))  # an all-gather skips the check in 2.19, and from 2.22 on


def dev_op(redop: str, dtype: str) -> str | None:
    """The device op NCCL runs for `redop` on `dtype` (hostToDevRedOp); None: NCCL has none (bitwise ops)."""
    if redop == "avg":
        return "SumPostDiv" if dtype in INTEGERS else "PreMulSum"
    return _DEV.get(redop)


def nvls_supported(kind: str, redop: str, dtype: str, version: tuple[int, int]) -> bool:
    """Whether NCCL `version` lets NVLS / NVLS-Tree run `kind` with `redop` on `dtype` (the op of an all-gather,
    which reduces nothing, is Sum)."""
    if kind == "all_gather":
        if version == ALL_GATHER_EXEMPT[0] or version >= ALL_GATHER_EXEMPT[1]:
            return True
        redop = "sum"
    op = dev_op(redop, dtype)
    return (op == "Sum" and dtype in NVLS_MINMAX + NVLS_SUM) or (op == "MinMax" and dtype in NVLS_MINMAX)


def skipped(kind: str, redop: str, dtype: str, version: tuple[int, int]) -> frozenset[str]:
    """The algorithms NCCL's tuner skips for this call because of its op and datatype (before it rates any)."""
    out: set[str] = set()
    if kind in ("all_reduce", "reduce_scatter", "all_gather") and not nvls_supported(kind, redop, dtype, version):
        out |= {"nvls", "nvls_tree"}
    if kind == "reduce_scatter" and dev_op(redop, dtype) in ("PreMulSum", "SumPostDiv"):
        out.add("pat")
    return frozenset(out)


FP8_RING_FROM = (2, 24)  # the first NCCL that relegates fp8 rings
FP8_RING_MAX_RANKS = 8  # ... over more ranks than this


def least_preferred(dtype: str, nranks: int, version: tuple[int, int]) -> frozenset[str]:
    """The algorithms NCCL rates 1024x slower for this call's datatype: the ring for fp8 over more than 8 ranks."""
    if dtype == "fp8" and nranks > FP8_RING_MAX_RANKS and version >= FP8_RING_FROM:
        return frozenset({"ring"})
    return frozenset()
