"""nccl-tests' harness flags beyond sizes and loops (-C -S -J -I -K -M -u -p -y -T -R -x -D -V), checked as
nccl-tests 2.19.6 checks them (src/common.cu, main): its warnings (a value it disables or resets, printed on stderr
and the run goes on) and its errors, and the NCCL options the run passes on (-R, -x).

`harness_flags` is the one place that reads them; `nccl_run_options` the one place that turns them into what the
NCCL model is given (-R and -x as NCCL sees them, see docs/nccl-tests.md).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl.settings import nccl_env, nccl_release_of
from phantora.errors import InputError

LOCAL_REGISTER, SYMMETRIC_REGISTER = 1, 2  # -R values (common.cu)
CTA_POLICY_NAMES = {1: "EFFICIENCY", 2: "ZERO"}  # NCCL_CTA_POLICY's names for the bits (init.cc, 2.30)
CTA_POLICY_MAX = 0 | 1 | 2  # NCCL's ctaPolicyIsValid: any OR of the policies (init.cc, 2.29.2+)
CTA_POLICY_ZERO = 2  # 2.28.x: a config's CTAPolicy above NCCL_CTA_POLICY_ZERO is invalid
CTA_POLICY_OR_FROM = 22902  # ctaPolicyIsValid, policies OR-ed
DEVICE_CTA_DEFAULT = 16  # -V's default (common.cu: deviceCtaCount)


_C_INT = re.compile(r"\s*([-+]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*")


def c_int(text: str) -> int:
    """An integer flag as nccl-tests reads it, `strtol(optarg, NULL, 0)`: decimal, 0x hexadecimal or leading-0
    octal (`-w 010` is 8), with a sign. strtol would read a prefix of anything and 0 of no digits; a value that is
    not wholly such a number is refused (argparse names the flag), so that a typo cannot change the run."""
    m = _C_INT.fullmatch(text)
    if not m:
        raise ValueError(text)
    digits = m.group(2)
    base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10
    value = int(digits[2:] if base == 16 else digits, base)
    return -value if m.group(1) == "-" else value


c_int.__name__ = "int"  # argparse names the type in its error: "invalid int value: 'x'", as for int


@dataclass(frozen=True)
class HarnessFlags:
    """The flags as the run uses them, after nccl-tests' own checks."""

    report_cputime: bool = False  # -C: the time columns are the host's CPU time per call
    report_timestamps: bool = False  # -S: a timestamp after each line
    output_file: str | None = None  # -J: nccl-tests' JSON file
    per_iter_timing: bool = False  # -I: each iteration timed by CUDA events, min / max / p99 / cv% columns
    per_iter_skip: int = 0  # -K: leading iterations left out of -I's summary
    memory_report: bool = False  # -M: the GPU memory usage line
    unalign: int = 0  # -u: buffers offset by this many elements
    parallel_init: bool = False  # -p: each thread initialises its own communicators
    stream_null: bool = False  # -y: the calls run on CUDA's NULL stream
    timeout: int = 0  # -T: seconds a call may take before the test aborts (0: none)
    local_register: int = 0  # -R: 0 none, 1 ncclCommRegister, 2 symmetric window registration
    cta_policy: int = -1  # -x: NCCL_CTA_POLICY of the communicators (-1: not set)
    device_impl: int = 0  # -D: nccl-tests' device API kernels (0: NCCL's own collectives)
    device_cta_count: int = DEVICE_CTA_DEFAULT  # -V: CTAs of the device implementation
    blocking: int = 0  # -z after nccl-tests' checks (-z 3 with -G is turned off)


def add_arguments(g: argparse._ArgumentGroup) -> None:
    """The flags on the nccl-tests parser, short and long as nccl-tests names them."""
    for short, long, meta, text in (
        ("-C", "--report_cputime", "0/1", "1: the time columns are the host's CPU time per call (the launches)"),
        ("-S", "--report_timestamps", "0/1", "1: a timestamp after each line"),
        ("-I", "--per_iter_timing", "0/1", "1: per-iteration CUDA event timing, i_min i_max i_p99 i_cv%% columns"),
        ("-K", "--per_iter_skip", "N", "leading iterations left out of -I's summary (default 0)"),
        ("-M", "--memory", "0/1", "1: the GPU memory usage line (the test's buffers; NCCL's own is N/A)"),
        ("-u", "--unalign", "N", "misalign the buffers by N elements (NCCL's choice is unchanged)"),
        ("-p", "--parallel_init", "0/1", "1: threads initialise their communicators (no effect on the times)"),
        ("-y", "--stream_null", "0/1", "1: CUDA's NULL stream (no effect on the times; not with -G)"),
        ("-T", "--timeout", "SECONDS", "abort a call after this long (a simulated call never hangs: accepted)"),
        ("-R", "--local_register", "0/1/2", "buffer registration: 0 none, 1 ncclCommRegister, 2 symmetric window"),
        ("-x", "--cta_policy", "0/1/2", "NCCL_CTA_POLICY of the communicators: 0 default, 1 efficiency, 2 zero"),
        ("-D", "--device_implementation", "N", "nccl-tests' device API kernels: not modelled (0 only)"),
        ("-V", "--device_cta_count", "N", "CTAs of -D's kernels (default 16)"),
    ):
        default = -1 if short == "-x" else (DEVICE_CTA_DEFAULT if short == "-V" else 0)
        g.add_argument(short, long, type=c_int, default=default, metavar=meta, help=text)
    g.add_argument("-J", "--output_file", default=None, metavar="FILE", help="nccl-tests' JSON output (a .json file)")


def harness_flags(
    args: argparse.Namespace, *, iters: int, graph: int, blocking: int, nccl_version: int, warn: list[str]
) -> HarnessFlags:
    """The flags of `args` after nccl-tests' checks, in its order. A value nccl-tests disables or resets appends
    nccl-tests' own stderr line to `warn` and the run goes on; a value nccl-tests stops on, or one phantora does not
    model, is an InputError naming the flag."""
    version_228 = nccl_version >= 22800
    if args.device_implementation != 0 and not version_228:
        raise InputError("Option -D (device implementation) requires NCCL >= 2.28.0", field="-D")
    cta = DEVICE_CTA_DEFAULT
    if args.device_cta_count != DEVICE_CTA_DEFAULT:
        if not version_228:
            raise InputError("Option -V (device CTA count) requires NCCL >= 2.28.0", field="-V")
        cta = args.device_cta_count
        if cta <= 0 or cta > 128:
            warn.append(f"device_cta_count (-V) must be positive and less than 128, got {cta}. Using default value 16.")
            cta = DEVICE_CTA_DEFAULT
    register = args.local_register
    if register not in (0, SYMMETRIC_REGISTER):  # common.cu: any other non-zero value calls ncclCommRegister
        register = LOCAL_REGISTER
    if register == SYMMETRIC_REGISTER and nccl_version < 22700:
        warn.append("Option -R 2 (symmetric) is not supported before NCCL 2.27. Defaulting to local registration")
        register = LOCAL_REGISTER
    policy = args.cta_policy
    if policy > 1 and nccl_version < 22800:
        warn.append(f"Option -x (cta_policy) {policy} is not supported before NCCL 2.28. Ignoring")
        policy = -1
    top = CTA_POLICY_MAX if nccl_version >= CTA_POLICY_OR_FROM else CTA_POLICY_ZERO
    if policy > top:  # init.cc parseCommConfig: WARN "Invalid config policy attribute value", ncclInvalidArgument
        raise InputError(
            f'{policy}: NCCL fails ncclCommInitRankConfig on it ("Invalid config policy attribute value {policy}", '
            f"ncclInvalidArgument); this NCCL takes 0 to {top}",
            field="-x",
        )
    if args.device_implementation > 0 and register != SYMMETRIC_REGISTER:
        raise InputError(
            "device implementation (-D > 0) requires enabling symmetric memory registration (-R 2)", field="-D"
        )
    per_iter = args.per_iter_timing
    if per_iter not in (0, 1):
        warn.append("per-iteration timing (-I) only supports 0=off or 1=on. Disabling.")
        per_iter = 0
    if per_iter and graph >= 1:
        warn.append("per-iteration timing (-I) is incompatible with CUDA graph mode (-G). Disabling.")
        per_iter = 0
    if blocking == 3 and graph >= 1:
        warn.append("blocking mode (-z 3) is incompatible with CUDA graph mode (-G). Disabling.")
        blocking = 0
    skip = args.per_iter_skip
    if skip < 0 or skip >= iters:
        warn.append(f"per-iteration skip (-K) must be between 0 and {iters - 1}. Disabling.")
        skip = 0
    if skip and not per_iter:
        warn.append("per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.")
        skip = 0
    if args.device_implementation != 0:
        raise InputError(
            f"-D {args.device_implementation}: nccl-tests' device API kernels (NCCL's device communicators) are not "
            "modelled (docs/nccl-tests.md)",
            field="-D",
        )
    if args.unalign < 0:
        raise InputError(f"must be >= 0, got {args.unalign}: the buffers would start before their allocation",
                         field="-u")  # fmt: skip
    if args.stream_null and graph >= 1:
        raise InputError("CUDA cannot capture a graph (-G) on the NULL stream (-y 1): cudaStreamBeginCapture fails",
                         field="-y")  # fmt: skip
    if args.report_cputime and graph >= 1:
        raise InputError("the host's cost of a CUDA graph launch (-G) is not modelled, so its CPU time is not known",
                         field="-C")  # fmt: skip
    return HarnessFlags(
        report_cputime=bool(args.report_cputime),
        report_timestamps=bool(args.report_timestamps),
        output_file=args.output_file,
        per_iter_timing=bool(per_iter),
        per_iter_skip=skip,
        memory_report=bool(args.memory),
        unalign=args.unalign,
        parallel_init=bool(args.parallel_init),
        stream_null=bool(args.stream_null),
        timeout=args.timeout,
        local_register=register,
        cta_policy=policy,
        device_impl=args.device_implementation,
        device_cta_count=cta,
        blocking=blocking,
    )


def running_version_code(env: Mapping[str, str]) -> int:
    """The NCCL that runs (PHANTORA_NCCL_VERSION, else the one the model restates) as nccl-tests' test_ncclVersion,
    ncclGetVersion's code (2.26.2: 22602), which its -R / -x / -D / -V checks compare against."""
    major, minor, patch = nccl_release_of(env)
    return major * 10000 + minor * 100 + patch


def nccl_run_options(flags: HarnessFlags, granularity: str, agg: int = 1) -> AlgoOptions:
    """What the NCCL model is given for the run: the granularity, and -R / -x as NCCL would see them: -R as
    PHANTORA_NCCL_REGISTER (the buffers' registration), -x as NCCL_CTA_POLICY unless the environment sets it (NCCL's
    init.cc lets the variable override the communicator's config); collectives/nccl/register.py models both (and
    -R 2 with -m: a group's calls as one symmetric kernel, 2.28+, or none, 2.27)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "PHANTORA_NCCL_"))}
    if flags.local_register:
        env["PHANTORA_NCCL_REGISTER"] = str(flags.local_register)
    if flags.cta_policy > 0 and not env.get("NCCL_CTA_POLICY"):  # one policy as its number, read by 2.27+
        bits = [CTA_POLICY_NAMES[bit] for bit in (1, 2) if flags.cta_policy & bit]
        env["NCCL_CTA_POLICY"] = str(flags.cta_policy) if len(bits) == 1 else "|".join(bits)
    if not flags.local_register and flags.cta_policy <= 0:
        return AlgoOptions(granularity=granularity)
    return AlgoOptions(granularity=granularity, nccl_env=nccl_env(env))
