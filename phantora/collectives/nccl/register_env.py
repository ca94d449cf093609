"""The variables that say how a communicator's buffers are registered and which symmetric kernels and CTA policy
NCCL may use, parsed as NCCL (and nccl-tests) read them.

- `PHANTORA_NCCL_REGISTER` (phantora's own, as `PHANTORA_NCCL_VERSION` is): what nccl-tests' `-R` does to its
  buffers. 0: none; 1: `ncclCommRegister` (local registration); 2: `ncclCommWindowRegister(...,
  NCCL_WIN_COLL_SYMMETRIC)` (a symmetric window, NCCL 2.27+; nccl-tests falls back to 1 before 2.27).
- `NCCL_SYM_KERNEL`: one symmetric kernel's name (`sym_kernels.cc` kernelName[]); unset or `^`: all.
- `NCCL_CTA_POLICY` (NCCL 2.27+): `0`/`1`/`2` (DEFAULT, EFFICIENCY, ZERO), or from 2.29.2 names joined by `|`.
"""

from __future__ import annotations

from collections.abc import Mapping

from phantora.errors import InputError

REGISTER_MODES = {0: "none", 1: "local", 2: "symmetric"}
CTA_POLICY_BITS = {"DEFAULT": 0, "EFFICIENCY": 1, "ZERO": 2}  # nccl.h NCCL_CTA_POLICY_*
SYM_KERNEL_NAMES = (  # every NCCL 2.27-2.30 symmetric kernel name (sym_kernels.cc, symmetric.cc)
    "AllReduce_AGxLL_R",
    "AllReduce_AGxLLMC_R",
    "AllReduce_RSxTmaLD_AGxTmaST",
    "AllReduce_RSxLD_AGxST",
    "AllReduce_RSxLDMC_AGxSTMC",
    "AllReduce_RSxNet_ARxMC_AGxNet",
    "AllGather_LL",
    "AllGather_LLMC",
    "AllGather_TmaST",
    "AllGather_ST",
    "AllGather_TmaSTMC",
    "AllGather_STMC",
    "AllGather_GinHier_MCRing",
    "AllGather_RailRing_LsaSTMC",
    "ReduceScatter_LL",
    "ReduceScatter_TmaLD",
    "ReduceScatter_LD",
    "ReduceScatter_LDMC",
    "ReduceScatter_RailA2A_LsaLD",
    "ReduceScatter_RailA2A_LsaLDMC",
)


def register_of(env: Mapping[str, str]) -> int:
    """PHANTORA_NCCL_REGISTER: 0, 1 or 2 (nccl-tests' -R values); unset: 0."""
    var = "PHANTORA_NCCL_REGISTER"
    text = env.get(var, "").strip()
    if not text:
        return 0
    if text not in ("0", "1", "2"):
        raise InputError(f"{var}={text!r}: 0 (none), 1 (ncclCommRegister) or 2 (symmetric window)", field=var)
    return int(text)


def sym_kernel_of(env: Mapping[str, str]) -> str:
    """NCCL_SYM_KERNEL: a kernel name, or "" for all (unset or `^`). NCCL takes an unknown name as "none of
    them"; a name no NCCL has is refused here, so a typo does not silently turn the kernels off."""
    var = "NCCL_SYM_KERNEL"
    text = env.get(var, "").strip()
    if text in ("", "^"):
        return ""
    if text not in SYM_KERNEL_NAMES:
        known = ", ".join(SYM_KERNEL_NAMES)
        raise InputError(f"{var}={text!r}: not a symmetric kernel of NCCL 2.27-2.30 ({known})", field=var)
    return text


def cta_policy_of(env: Mapping[str, str], names: bool = True) -> int:
    """NCCL_CTA_POLICY as init.cc parses it: a leading digit 0/1/2 (DEFAULT, EFFICIENCY, ZERO), else names
    joined by `|` (2.29.2+), OR-ed; unset: 0 (DEFAULT). `names`: the NCCL that runs reads names (2.27 - 2.29.1 read
    the variable as an integer, NCCL_PARAM, and ignore a name: refused here, as an unknown name is)."""
    var = "NCCL_CTA_POLICY"
    text = env.get(var, "").strip()
    if not text:
        return 0
    if text[0].isdigit():
        if text[0] not in "012":
            raise InputError(f"{var}={text!r}: 0 (DEFAULT), 1 (EFFICIENCY) or 2 (ZERO)", field=var)
        return (0, 1, 2)[int(text[0])]
    if not names:
        raise InputError(f"{var}={text!r}: this NCCL reads a number, 0, 1 or 2 (the names came in 2.29.2)", field=var)
    bits = 0
    for token in text.split("|"):
        name = token.strip().upper()
        if name not in CTA_POLICY_BITS:
            raise InputError(f"{var}={text!r}: names are DEFAULT, EFFICIENCY, ZERO joined by '|'", field=var)
        bits |= CTA_POLICY_BITS[name]
    if bits & 2 and bits & 1:  # init.cc: ZERO and EFFICIENCY together keep ZERO
        bits &= ~1
    return bits
