"""Sweep `phantora nccl-tests` as a demanding user would and print every violation of physics or format.

Each case runs the command (`--out` to a scratch directory) and checks every table line: rc 0 and no
traceback; algbw x time = size; busbw = algbw x nccl-tests' factor; `#wrong` is 0 (N/A with -c 0); busbw at
most the hardware's cut bound (a GPU's own links: NVLink or PCIe plus its NIC, x 2(n-1)/n for an
all-reduce whose switch reduces (NVLS); a host's NICs for the bytes that must leave it); time non-decreasing
in size for one choice (algorithm, protocol, channels) within a block; results.json's choice equal to the
line's comment. Bad-input cases must give rc != 0 and one stderr line naming the flag, variable or file.

The `reg:` cases (`reg_cases`) add buffer registration (-R 0/1/2), -x / NCCL_CTA_POLICY, nccl-tests' other flags
(-C -S -I -K -J -M -u -p -y -T, -G / -m / -z with -R) and PHANTORA_NCCL_VERSION 2.19 .. 2.30, and three checks: under
-R 2 on one NVLink host the line's kernel (and CTAs) are the ones NCCL's picker gives (`nccl_sym_pick`, restated
here from NCCL's src/sym_kernels.cc and symmetric.cc, not from phantora's model), and no symmetric kernel where
NCCL runs none; -R 1 is never slower than the same command at -R 0 on a line whose choice (algorithm, protocol,
channels) is the same (registration then only removes copies); -J's JSON parses and its rows equal the table's.
A symmetric multicast all-reduce kernel (`kernel=..MC..`) gets NVLS's bound (the switch reduces).

    .venv/bin/python bench/bench_nccl_sweep.py [--quick] [--ns3] [--only SUBSTRING] [--reg-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from phantora.perfmodel.gpus import get_gpu  # noqa: E402

PHANTORA = [str(ROOT / ".venv/bin/phantora"), "nccl-tests"]
TESTS = [
    "all_reduce_perf",
    "all_gather_perf",
    "reduce_scatter_perf",
    "alltoall_perf",
    "broadcast_perf",
    "reduce_perf",
    "sendrecv_perf",
]
FACTOR = {
    "all_reduce_perf": lambda n: 2 * (n - 1) / n,
    "all_gather_perf": lambda n: (n - 1) / n,
    "reduce_scatter_perf": lambda n: (n - 1) / n,
    "alltoall_perf": lambda n: (n - 1) / n,
    "broadcast_perf": lambda n: 1.0,
    "reduce_perf": lambda n: 1.0,
    "sendrecv_perf": lambda n: 1.0,
}

TOPOS_TOML = {
    "l40s8": 'name = "l40s8"\ngpu = "l40s"\n[generator]\nkind = "pcie_host"\ngpus_per_host = 8\nsockets = 2\n',
    "nvl72": 'name = "nvl72"\ngpu = "b200"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 72\n',
    "rail4x8": 'name = "rail4x8"\ngpu = "h100"\n[generator]\nkind = "rail_optimized"\nhosts = 4\n'
    "gpus_per_host = 8\nspines = 2\n",
    "ls4x1": 'name = "ls4x1"\ngpu = "h100"\n[generator]\nkind = "leaf_spine"\nleaves = 2\n'
    "endpoints_per_leaf = 2\nspines = 1\ngpus_per_host = 1\n",
}
BAD_TOML = {
    "bad_key.toml": '[generator]\nkind = "dgx_host"\ngpus_per_hots = 8\n',
    "bad_syntax.toml": "[generator\nkind = 1\n",
    "bad_kind.toml": '[generator]\nkind = "torus"\n',
}


@dataclass
class Case:
    """One command line: the test, its flags and the environment's NCCL_* settings."""

    name: str
    test: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    expect_error: str | None = None  # a substring the one-line error must hold
    pair: str = ""  # -R 0 / -R 1 runs of one command share this key (the -R 1 one must not be slower)
    sym_gpu: str = ""  # -R 2 on one NVLink server of this GPU: check the kernel against NCCL's picker


@dataclass
class Bounds:
    """A topology's link rates in bytes/s: per GPU (NVLink or PCIe, NIC) and per host (NICs)."""

    gpu_nvlink: float
    gpu_pcie: float
    gpu_nic: float
    host_nic: float
    gpus_per_host: int
    hosts: int


def topo_bounds(topo: str | None, gpu: str | None) -> Bounds:
    """Link rates from `phantora topo --json` (the default server when topo is None)."""
    spec = topo or "dgx8_default"
    if topo is None:
        tmp = Path(tempfile.gettempdir()) / "sweep_default.toml"
        tmp.write_text(f'name = "dgx8"\ngpu = "{gpu or "h100"}"\n[generator]\nkind = "dgx_host"\n')
        spec = str(tmp)
    out = subprocess.run(
        [str(ROOT / ".venv/bin/phantora"), "topo", spec, "--json", "--no-bisection"],
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(out.stdout)
    ranks, hosts = d["ranks"], d["hosts"]
    pcie = d["generator"].get("kind") == "pcie_host" if d.get("generator") else False
    nv = nic = pc = 0.0
    for cls in d["link_classes"]:
        per_gpu = cls["rate_bps"] / 8 * cls["count"] / ranks
        if cls["ends"] == "gpu-nvswitch":
            nv += per_gpu
        elif cls["ends"] == "gpu-switch":
            if pcie:
                pc += per_gpu
            else:
                nic += per_gpu
    gph = ranks // hosts
    return Bounds(nv, pc, nic, nic * gph, gph, hosts)


# ns-3's default packet: 48 B of headers per 1000 B of payload, and a 48-byte ACK back per packet, which shares the
# wire of a NIC that also sends (every test on ls4x1 has such NICs; phantora/netsim/ack_stream.py)
GOODPUT_SLACK = (1000 + 48 + 48) / 1000
WIRE = {"LL": 2.0, "LL128": 128 / 120}  # wire bytes per data byte: LL's 8-byte lines are half flags


def busbw_bound(test: str, n: int, b: Bounds, algo: str, proto: str = "Simple", kernel: str = "") -> float:
    """The largest busbw (GB/s) the links allow for n ranks (host-major from rank 0) under the protocol's wire
    factor. A symmetric all-reduce kernel that reduces in the switch (`..LDMC..`, multimem ld_reduce) is bound as
    NVLS is; its multicast-store LL kernel (`AGxLLMC_R`) sends each GPU's S once and reduces on the GPU, so it is
    bound as any other."""
    per_gpu = b.gpu_nvlink + b.gpu_pcie + b.gpu_nic
    f = FACTOR[test](n) if n > 1 else 1.0
    bound = per_gpu
    switch_reduces = algo.startswith("NVLS") or (algo == "sym" and "LDMC" in kernel)
    if test == "all_reduce_perf" and switch_reduces:
        bound = per_gpu * f  # each GPU sends at least S when the switch reduces
    hosts = math.ceil(n / b.gpus_per_host)
    g = min(n, b.gpus_per_host)
    if hosts > 1 and b.host_nic > 0:
        e = b.gpu_nic * g
        h = hosts
        if test == "all_reduce_perf":
            alg = h * e / (2 * (h - 1))
        elif test in ("all_gather_perf", "reduce_scatter_perf"):
            alg = h * e / (h - 1)
        elif test == "alltoall_perf":
            alg = e * n / (g * (n - g))
        else:
            alg = e
        bound = min(bound, alg * f)
    return bound / 1e9 / WIRE.get(proto, 1.0)


# NCCL's symmetric kernels on one NVLink domain, restated from NCCL (v2.27.3-1 src/symmetric.cc, v2.28.3-1 ..
# v2.30.7-1 src/sym_kernels.cc: ncclSymkMask, queryModel_lsa, ncclSymkPickKernel), to check the line's kernel against
# NCCL's own picker rather than against phantora's restatement: (name, LL, needs multicast store, needs ld_reduce)
SYM_KERNELS = {
    "all_reduce_perf": [
        ("AllReduce_AGxLL_R", True, False, False),
        ("AllReduce_AGxLLMC_R", True, True, False),
        ("AllReduce_RSxLD_AGxST", False, False, False),
        ("AllReduce_RSxLDMC_AGxSTMC", False, True, True),
    ],
    "all_gather_perf": [
        ("AllGather_LL", True, False, False),
        ("AllGather_LLMC", True, True, False),
        ("AllGather_ST", False, False, False),
        ("AllGather_STMC", False, True, False),
    ],
    "reduce_scatter_perf": [
        ("ReduceScatter_LL", True, False, False),
        ("ReduceScatter_LD", False, False, False),
        ("ReduceScatter_LDMC", False, True, True),
    ],
}


ELT_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
             "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}  # fmt: skip


def _version(text: str) -> tuple[int, int, int]:
    """PHANTORA_NCCL_VERSION as (major, minor, patch); a bare minor is its newest patch (99 here)."""
    parts = [int(x) for x in text.split(".")]
    return (parts[0], parts[1], parts[2] if len(parts) > 2 else 99)


def nccl_sym_pick(
    test: str, count: int, n: int, capability: int, nvls: bool, version: str, elt: int = 4, ldmc: bool = True
) -> tuple[str, int] | None:
    """(kernel, CTAs) NCCL's picker gives a sum of `count` elements of `elt` bytes (nccl-tests' count column: a
    rank's part for all-gather and reduce-scatter) on n GPUs of one NVLink domain, alone in its group; `ldmc`: the
    type has a multimem ld_reduce; None: no kernel (NCCL runs its legacy algorithms)."""
    rel = _version(version)
    if rel < (2, 27, 0) or test not in SYM_KERNELS:
        return None
    if rel >= (2, 28, 0):
        cell = 1024 // elt  # NCCL_SYM_KERNEL_CELL_SIZE: 1 KiB
        count = -(-count // cell) * cell
    nbytes = count * elt
    bus = nbytes * (1 if test == "all_reduce_perf" else n)
    stmc = nvls and (n > 2 or rel < (2, 29, 7))  # hasLsaMultimem: more than 2 GPUs from 2.29.7
    hopper = capability < 100
    gbps = (1 << 30) / 1e6
    best: tuple[np.float32, str, int] | None = None
    for name, ll, mc, ldmc_k in SYM_KERNELS[test]:
        if (mc and not stmc) or (ldmc_k and not (stmc and ldmc)):
            continue
        if (ll and bus >= 2 << 30) or bus >= 32 * (2 << 30):
            continue
        lat = (4.5 if ll else 7.8) if hopper else ((8.5 if "Gather" in name else 11.0) if ll else 13.0)
        if not hopper and name.startswith("AllReduce") and not ll:
            lat = 19.5
        sm_bw = (65 if name.startswith("AllReduce") else 44) * gbps if hopper else 55 * gbps
        peak = (320 if hopper else 600) * gbps
        if name == "AllReduce_RSxLDMC_AGxSTMC":
            peak = (480 if hopper else 1000) * gbps
        mult, most = 1.0, 64
        if ll:
            busb = n * nbytes * 9.0
            mult = 1.1 if "LLMC" in name else 1.0
        elif name == "AllReduce_RSxLD_AGxST":
            busb = 2 * nbytes * (n - 1) // n
        elif name == "AllReduce_RSxLDMC_AGxSTMC":
            busb, mult, most = nbytes // n + nbytes, float(n), -(-(16 if hopper else 32) // n)
        elif mc:
            busb, mult, most = (n - 1) * nbytes, 0.55 * n, -(-(16 if hopper else 32) // n)
        else:
            busb = (n - 1) * nbytes

        def model(ctas: int, busb: float = busb, lat: float = lat, sm_bw: float = sm_bw, mult: float = mult,
                  peak: float = peak) -> float:  # fmt: skip
            bw = peak - sm_bw * math.log1p(math.expm1(peak / sm_bw) * math.exp(-ctas * sm_bw * mult / sm_bw))
            z = busb / bw - 1
            return lat + (z if z >= 100 else math.log1p(math.exp(z)))

        t, ctas = float(np.float32(model(most))), most
        for bn in range(1, most):
            tb = model(bn)
            if tb <= 1.025 * t:
                t, ctas = float(np.float32(tb)), bn
                break
        score = np.float32(t) * (np.float32(1.0) + np.float32(0.025) * np.float32(ctas))
        if best is None or score < best[0]:
            best = (score, name, ctas)
    return None if best is None else (best[1], best[2])


def parse_table(stdout: str, per_iter: bool = False, stamp: bool = False) -> list[dict[str, Any]]:
    """The size lines: nccl-tests' 13 columns (+ 4 per group with -I, + a date and time with -S) and the choice
    comment."""
    group = 8 if per_iter else 4
    width = 5 + 2 * group + (2 if stamp else 0)
    rows: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        body, _, comment = line.partition("#")
        f = body.split()
        if len(f) != width:
            rows.append({"bad": line})
            continue
        choice = dict(kv.split("=", 1) for kv in comment.split() if "=" in kv)
        rows.append(
            {
                "size": int(f[0]),
                "count": int(f[1]),
                "type": f[2],
                "redop": f[3],
                "root": int(f[4]),
                "time": float(f[5]),
                "algbw": float(f[6]),
                "busbw": float(f[7]),
                "wrong": f[8],
                "ip": f[5 + group : 9 + group],
                "iter": f[9:13] if per_iter else [],
                "ip_iter": f[9 + group : 13 + group] if per_iter else [],
                "stamp": " ".join(f[5 + 2 * group :]) if stamp else "",
                "choice": choice,
            }
        )
    return rows


def flag_value(args: list[str], name: str, default: str = "") -> str:
    """The value given to a flag in a command line (the last one), or `default`."""
    idx = [i for i, a in enumerate(args[:-1]) if a == name]
    return args[idx[-1] + 1] if idx else default


def choice_switch_drops(rows: list[dict[str, Any]]) -> list[str]:
    """Sizes whose time is below the previous size's where NCCL's choice changed between them: not a violation
    (NCCL picks by its own model), but where the simulated times disagree with the model that chose."""
    out: list[str] = []
    prev: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if "bad" in r:
            continue
        k = (r["type"], r["redop"], r["root"])
        p = prev.get(k)
        if p and r["size"] > p["size"] and r["time"] + 0.011 < p["time"]:
            a = f"{p['choice'].get('algorithm')}/{p['choice'].get('protocol')}"
            b = f"{r['choice'].get('algorithm')}/{r['choice'].get('protocol')}"
            out.append(f"{p['size']}B {p['time']} us ({a}) > {r['size']}B {r['time']} us ({b})")
        prev[k] = r
    return out


def check_case(case: Case, rc: int, out: str, err: str, outdir: Path, bounds: Bounds | None) -> list[str]:
    """Every violation of one run, as one line each."""
    v: list[str] = []
    if "Traceback" in err or "Traceback" in out:
        v.append("traceback: " + err.strip().splitlines()[-1][:160])
    if case.expect_error is not None:
        lines = [x for x in err.strip().splitlines() if x.strip()]
        if rc == 0:
            v.append("bad input accepted (rc 0)")
        elif len(lines) != 1:
            v.append(f"error is {len(lines)} lines: {err.strip()[:200]!r}")
        elif case.expect_error.lower() not in lines[0].lower():
            v.append(f"error does not name {case.expect_error!r}: {lines[0][:200]}")
        return v
    if rc != 0:
        lines = [x for x in err.strip().splitlines() if x.strip()]
        if case.env and len(lines) == 1 and "NCCL fails here too" in lines[0]:
            return v  # a forced choice NCCL cannot run: its own error (enqueue.cc), as NCCL
        return v + [f"rc {rc}: {(lines or [''])[-1][:200]}"]
    rows = parse_table(out, flag_value(case.args, "-I", "0") == "1", flag_value(case.args, "-S", "0") == "1")
    if not rows:
        return v + ["no table lines"]
    n = json.loads((outdir / "results.json").read_text())
    ranks = n["ranks"]
    sizes = n["sizes"]
    if len(sizes) != len(rows):
        v.append(f"results.json has {len(sizes)} sizes, table {len(rows)}")
    check_off = "-c" in case.args and case.args[case.args.index("-c") + 1] == "0"
    cputime = flag_value(case.args, "-C", "0") == "1"  # the time columns hold the host's CPU time, not the GPUs'
    v += sym_violations(case, rows, ranks)
    if flag_value(case.args, "-J"):
        v += json_violations(Path(flag_value(case.args, "-J")), rows, cputime)
    last: dict[tuple, tuple[int, float]] = {}
    for i, r in enumerate(rows):
        if "bad" in r:
            v.append(f"line not 13 columns: {r['bad'][:120]}")
            continue
        tag = f"{r['size']}B {r['type']} {r['redop']} root{r['root']}"
        t, alg, bus = r["time"], r["algbw"], r["busbw"]
        if r["wrong"] != ("N/A" if check_off else "0"):
            v.append(f"{tag}: #wrong {r['wrong']}")
        if t < 0 or (r["size"] > 0 and t <= 0):
            v.append(f"{tag}: time {t}")
        if t > 0 and not cputime:
            exp_alg = r["size"] / (t * 1e3)
            if abs(alg - exp_alg) > 0.006 + 1e-3 * exp_alg:
                v.append(f"{tag}: algbw {alg} != size/time {exp_alg:.3f}")
        exp_bus = (r["size"] / (t * 1e3) if t > 0 else 0.0) * FACTOR[case.test](ranks)
        slack = 0.006
        if cputime:  # the printed algbw (rounded to 0.005) x the factor
            exp_bus, slack = alg * FACTOR[case.test](ranks), 0.006 + 0.005 * FACTOR[case.test](ranks)
        if abs(bus - exp_bus) > slack + 1e-3 * exp_bus:
            v.append(f"{tag}: busbw {bus} != algbw x factor {exp_bus:.3f}")
        if ranks == 1 and t > 0 and r["size"] > 0:
            hbm = get_gpu(n["topology"].get("gpu_model") or "h100").mem_bw / 1e9
            if alg > hbm / 2 * 1.0005 + 0.01:  # one rank: NCCL copies the buffer (read + write)
                v.append(f"{tag}: one rank's algbw {alg} above its memory's copy rate {hbm / 2:.1f} GB/s")
        if bounds is not None and r["size"] > 0 and ranks > 1:
            ch = r["choice"]
            cap = busbw_bound(
                case.test, ranks, bounds, ch.get("algorithm", ""), ch.get("protocol", "Simple"), ch.get("kernel", "")
            )
            if bus > cap * 1.0005 + 0.01:
                v.append(f"{tag}: busbw {bus} above the links' {cap:.2f} GB/s ({r['choice'].get('algorithm')})")
        if i < len(sizes):
            s = sizes[i]
            rc_choice = {k: str(val) for k, val in (s.get("choice") or {}).items()}
            for k in ("algorithm", "protocol", "channels", "kernel"):
                if k in r["choice"] and rc_choice.get(k) != r["choice"][k]:
                    v.append(f"{tag}: table {k}={r['choice'][k]} results.json {rc_choice.get(k)}")
            if s["bytes"] != r["size"]:
                v.append(f"{tag}: results.json bytes {s['bytes']}")
        key = (
            r["type"],
            r["redop"],
            r["root"],
            r["choice"].get("algorithm"),
            r["choice"].get("protocol"),
            r["choice"].get("channels"),
        )
        if not cputime and key in last and r["size"] > last[key][0] and t + 0.011 < last[key][1]:
            v.append(f"{tag}: time {t} below {last[key][1]} at {last[key][0]}B, same choice")
        last[key] = (r["size"], t)
    return v


def sym_violations(case: Case, rows: list[dict[str, Any]], ranks: int) -> list[str]:
    """-R 2 on one NVLink server: each line runs the kernel on the CTAs NCCL's picker gives (`nccl_sym_pick`), or
    NCCL's legacy algorithms where NCCL has no symmetric kernel (another test, op, or type; NCCL before 2.27)."""
    if not case.sym_gpu:
        return []
    cap = get_gpu(case.sym_gpu).capability
    capability = cap[0] * 10 + cap[1]
    nvls = capability >= 90 and case.env.get("NCCL_NVLS_ENABLE", "2") != "0"
    version = case.env.get("PHANTORA_NCCL_VERSION", "2.30")
    v: list[str] = []
    for r in rows:
        if "bad" in r or r["size"] == 0:
            continue
        elt = ELT_BYTES[r["type"]]
        reduces = case.test != "all_gather_perf"
        # ncclSymkImplemented: a sum on a float type other than double; ncclSymkMask: multimem ld_reduce of a
        # 32-bit float sum, 16-bit floats, fp8 from compute capability 10.0
        ok = not reduces or (r["redop"] == "sum" and r["type"] in ("half", "float", "bfloat16", "f8e4m3", "f8e5m2"))
        ldmc = r["type"] in ("half", "float", "bfloat16") or (r["type"].startswith("f8") and capability >= 100)
        want = nccl_sym_pick(case.test, r["count"], ranks, capability, nvls, version, elt, ldmc) if ok else None
        ch = r["choice"]
        got = (ch.get("kernel"), int(ch.get("channels", 0))) if ch.get("algorithm") == "sym" else None
        if got != want:
            v.append(f"{r['size']}B {r['redop']}: kernel {got}, NCCL's picker {want}")
    return v


def json_violations(path: Path, rows: list[dict[str, Any]], cputime: bool) -> list[str]:
    """-J: the file parses as JSON and its results equal the table's lines, field for field."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"-J {path.name}: {type(e).__name__}: {str(e)[:120]}"]
    res = doc.get("results") or []
    if len(res) != len(rows):
        return [f"-J: {len(res)} results, table {len(rows)} lines"]
    v: list[str] = []
    for j, r in zip(res, rows, strict=True):
        if "bad" in r:
            continue
        head = (j["size"], j["count"], j["type"], j["redop"], int(str(j["root"]).strip()))
        if head != (r["size"], r["count"], r["type"], r["redop"], r["root"]):
            v.append(f"-J {head} != table {(r['size'], r['count'], r['type'], r['redop'], r['root'])}")
            continue
        for group, cols in (("out_of_place", (r["time"], r["algbw"], r["busbw"])), ("in_place", r["ip"][:3])):
            body = j[group]
            tkey = next(k for k in body if "time" in k)
            got = (body[tkey], body["alg_bw"], body["bus_bw"])
            for name, a, b in zip(("time", "algbw", "busbw"), got, cols, strict=True):
                if abs(float(a) - float(b)) > 0.006 + 1e-4 * abs(float(b)):
                    v.append(f"-J {r['size']}B {group} {name} {a} != table {b}")
            v += iter_violations(j.get(group + "_per_iter"), r["iter" if group == "out_of_place" else "ip_iter"])
    return v


def iter_violations(st: dict[str, Any] | None, cols: list[str]) -> list[str]:
    """-I's JSON summary against its own times as nccl-tests' computeIterStats (src/util.cu) takes them: the
    iterations after -K's skip, min, max, p50 = sorted[n / 2], p95 / p99 by nearest rank, cv% = population stdev /
    mean; and the table's i_min i_max i_p99 i_cv% columns."""
    if not st:
        return []
    t = sorted(st["times_us"][st["skipped_iterations"] :])
    n = len(t)
    if not n:
        return ["-I: no iterations after the skip"]
    mean = sum(t) / n
    cv = 100 * math.sqrt(sum((x - mean) ** 2 for x in t) / n) / mean if mean else 0.0
    rank = lambda pct: t[min(n - 1, (n * pct + 99) // 100 - 1)]  # noqa: E731
    want = {"min_us": t[0], "max_us": t[-1], "avg_us": mean, "p50_us": t[n // 2], "p95_us": rank(95),
            "p99_us": rank(99), "cv_pct": cv}  # fmt: skip
    v = [f"-I {k} {st[k]} != {x:.3f}" for k, x in want.items() if abs(st[k] - x) > 0.0015 + 1e-4 * abs(x)]
    if cols:
        for name, col, x in zip(("i_min", "i_max", "i_p99", "i_cv%"), cols, (t[0], t[-1], rank(99), cv), strict=True):
            if abs(float(col) - x) > 0.006 + 1e-3 * abs(x):
                v.append(f"-I table {name} {col} != {x:.3f}")
    return v


def cases(quick: bool) -> list[tuple[Case, str | None, str | None]]:
    """(case, topology, gpu): the sweep."""
    out: list[tuple[Case, str | None, str | None]] = []
    sz = ["-b", "8", "-e", "8G", "-f", "4", "-n", "2", "-w", "1"]
    topos: list[tuple[str | None, str | None]] = [
        (None, "a100"),
        (None, "h100"),
        (None, "h200"),
        (None, "b200"),
        ("pcie8_2s", None),
        ("@l40s8", None),
        ("testbed16", None),
        ("simai/rail16_h100", None),
        ("@rail4x8", None),
        ("@ls4x1", None),
        ("@nvl72", None),
        ("a100x64", None),
    ]
    if quick:
        topos = topos[1:2] + topos[6:7]
    for topo, gpu in topos:
        for test in TESTS:
            a = list(sz)
            if topo:
                a += ["--topology", topo]
            if gpu:
                a += ["--gpu", gpu]
            out.append((Case(f"{topo or gpu}:{test}", test, a), topo, gpu))
    # variants on the default server and on testbed16
    var = [
        ["-g", "8"],
        ["-g", "2", "-t", "2", "--np", "2"],
        ["--np", "4"],
        ["-g", "4"],
        ["-d", "all", "-b", "1K", "-e", "1M"],
        ["-o", "all", "-b", "1K", "-e", "1M"],
        ["-r", "-1", "-b", "1K", "-e", "1M"],
        ["-m", "4"],
        ["-z", "1"],
        ["-G", "1"],
        ["-c", "0"],
        ["--np", "1"],
    ]
    for topo in (None, "testbed16"):
        for test in TESTS:
            for extra in var if not quick else var[:3]:
                a = sz + extra + (["--topology", topo] if topo else [])
                out.append((Case(f"{topo or 'h100'}:{test}:{' '.join(extra)}", test, a), topo, None))
    envs = [
        {"NCCL_ALGO": "Ring"},
        {"NCCL_ALGO": "Tree"},
        {"NCCL_ALGO": "NVLS"},
        {"NCCL_ALGO": "NVLSTree"},
        {"NCCL_ALGO": "PAT"},
        {"NCCL_ALGO": "CollnetDirect"},
        {"NCCL_ALGO": "ring,tree"},
        {"NCCL_ALGO": "^nvls"},
        {"NCCL_PROTO": "LL"},
        {"NCCL_PROTO": "LL128"},
        {"NCCL_PROTO": "Simple"},
        {"NCCL_PROTO": "^LL128"},
        {"NCCL_MIN_NCHANNELS": "32"},
        {"NCCL_MAX_NCHANNELS": "2"},
        {"NCCL_BUFFSIZE": "1048576"},
        {"NCCL_NVLS_ENABLE": "0"},
        {"NCCL_NVLS_ENABLE": "1"},
        {"NCCL_P2P_NET_CHUNKSIZE": "65536"},
        {"NCCL_P2P_DISABLE": "1"},
        {"NCCL_PXN_DISABLE": "1"},
        {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128"},
    ]
    for topo in (None, "testbed16", "@ls4x1", "pcie8_2s"):
        for test in TESTS if not quick else TESTS[:2]:
            for env in envs:
                a = sz + (["--topology", topo] if topo else [])
                tag = ",".join(f"{k}={v}" for k, v in env.items())
                out.append((Case(f"{topo or 'h100'}:{test}:{tag}", test, a, env), topo, None))
    bad = [
        Case("bad:test", "all_reduce_prf", ["-b", "8", "-e", "1K"], expect_error="all_reduce"),
        Case("bad:suffix", "all_reduce_perf", ["-b", "8X", "-e", "1K"], expect_error="-b"),
        Case("bad:esuffix", "all_reduce_perf", ["-b", "8", "-e", "1Q"], expect_error="-e"),
        Case("bad:b>e", "all_reduce_perf", ["-b", "1M", "-e", "1K"], expect_error="-b"),
        Case("bad:algo", "all_reduce_perf", ["-b", "8", "-e", "1K"], {"NCCL_ALGO": "foo"}, "NCCL_ALGO"),
        Case("bad:proto", "all_reduce_perf", ["-b", "8", "-e", "1K"], {"NCCL_PROTO": "bar"}, "NCCL_PROTO"),
        Case("bad:nch", "all_reduce_perf", ["-b", "8", "-e", "1K"], {"NCCL_MAX_NCHANNELS": "x"}, "NCCL_MAX_NCHANNELS"),
        Case("bad:buff", "all_reduce_perf", ["-b", "8", "-e", "1K"], {"NCCL_BUFFSIZE": "-5"}, "NCCL_BUFFSIZE"),
        Case("bad:neg", "all_reduce_perf", ["-b", "-8", "-e", "1K"], expect_error="-b"),
        Case("bad:f0", "all_reduce_perf", ["-b", "8", "-e", "1K", "-f", "0"], expect_error="-f"),
        Case("bad:n0", "all_reduce_perf", ["-b", "8", "-e", "1K", "-n", "0"], expect_error="-n"),
        Case("bad:g0", "all_reduce_perf", ["-b", "8", "-e", "1K", "-g", "0"], expect_error="-g"),
        Case("bad:np", "all_reduce_perf", ["-b", "8", "-e", "1K", "--np", "100"], expect_error="--np"),
        Case("bad:topo", "all_reduce_perf", ["-b", "8", "-e", "1K", "--topology", "nosuch"], expect_error="nosuch"),
    ]
    for name in BAD_TOML:
        bad.append(
            Case(f"bad:{name}", "all_reduce_perf", ["-b", "8", "-e", "1K", "--topology", "@" + name], expect_error=name)
        )
    out += [(c, None, None) for c in bad]
    return out


REG_SZ = ["-b", "1K", "-e", "64M", "-f", "16", "-n", "2", "-w", "1"]  # 1K, 16K, 256K, 4M, 64M
SYM_TESTS = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf")
VERSIONS = ("2.19", "2.21", "2.23", "2.26", "2.27", "2.28.3", "2.28.7", "2.29.2", "2.29.7", "2.30.3", "2.30")
FLAG_SETS = [
    ["-C", "1"],
    ["-S", "1"],
    ["-I", "1"],
    ["-I", "1", "-K", "1"],
    ["-J", "@JSON"],
    ["-M", "1"],
    ["-u", "3"],
    ["-p", "1"],
    ["-y", "1"],
    ["-T", "5"],
    ["-R", "2", "-J", "@JSON"],
    ["-R", "2", "-I", "1", "-S", "1"],
    ["-R", "1", "-M", "1", "-u", "1", "-C", "1"],
]


def _reg(
    out: list[tuple[Case, str | None, str | None]],
    name: str,
    test: str,
    extra: list[str],
    topo: str | None = None,
    gpu: str | None = None,
    env: dict[str, str] | None = None,
    pair: str = "",
    sym: bool = False,
    expect_error: str | None = None,
) -> None:
    a = REG_SZ + extra + (["--topology", topo] if topo else []) + (["--gpu", gpu] if gpu else [])
    sym_gpu = (gpu or "h100") if sym and topo is None and flag_value(extra, "-R") == "2" else ""
    out.append((Case(f"reg:{name}", test, a, env or {}, expect_error, pair, sym_gpu), topo, gpu))


def reg_cases(quick: bool) -> list[tuple[Case, str | None, str | None]]:
    """Registration (-R), CTA policy (-x, NCCL_CTA_POLICY), nccl-tests' other flags and NCCL releases, as a
    demanding user would run them: one-host servers of every GPU, 2-8 GPUs, PCIe hosts, rail fabrics."""
    out: list[tuple[Case, str | None, str | None]] = []
    gpus = ("h100",) if quick else ("a100", "h100", "h200", "b200")
    for gpu in gpus:  # every test at -R 0/1/2 on one server
        for test in TESTS:
            for r in ("0", "1", "2"):
                _reg(out, f"{gpu}:{test}:R{r}", test, ["-R", r], gpu=gpu, pair=f"{gpu}:{test}", sym=True)
    for gpu, nps in (("h100", ("2", "3", "4", "6")), ("b200", ("2", "4"))):  # 2-8 GPUs of one server
        for np_ in nps if not quick else nps[:1]:
            for test in SYM_TESTS:
                for r in ("0", "1", "2"):
                    pair = f"{gpu}:np{np_}:{test}"
                    _reg(out, f"{pair}:R{r}", test, ["--np", np_, "-R", r], gpu=gpu, pair=pair, sym=True)
    hosts = [("pcie8_2s", TESTS), ("@l40s8", SYM_TESTS), ("testbed16", TESTS), ("@rail4x8", SYM_TESTS)]
    for topo, tests in hosts if not quick else hosts[2:3]:  # PCIe hosts and rail fabrics
        for test in tests:
            for r in ("0", "1", "2"):
                _reg(out, f"{topo}:{test}:R{r}", test, ["-R", r], topo=topo, pair=f"{topo}:{test}")
    _reg(out, "pcie8_2s:all_reduce:R2:2.28", "all_reduce_perf", ["-R", "2"], "pcie8_2s",
         env={"PHANTORA_NCCL_VERSION": "2.28"}, expect_error="PHANTORA_NCCL_REGISTER")  # fmt: skip
    if not quick:
        for test in ("all_gather_perf", "reduce_scatter_perf"):
            for r in ("0", "2"):
                big = ["-b", "1M", "-e", "16M", "-f", "16", "-n", "2", "-w", "1", "--topology", "rail128", "-R", r]
                out.append((Case(f"reg:rail128:{test}:R{r}", test, big), "rail128", None))
    # -x and NCCL_CTA_POLICY
    for test in ("all_gather_perf", "reduce_scatter_perf", "all_reduce_perf", "alltoall_perf"):
        for x in ("0", "1", "2", "3", "5") if not quick else ("1", "2"):
            for r in ("0", "1", "2"):
                if r == "0" and x != "1":
                    continue
                zero = int(x) & 2 and x != "5" and r == "2" and test in ("all_gather_perf", "alltoall_perf")
                _reg(out, f"h100:{test}:x{x}:R{r}", test, ["-x", x, "-R", r], pair=f"h100:{test}:x{x}", sym=True,
                     expect_error="NCCL_CTA_POLICY" if zero else None)  # fmt: skip
    for pol in ("DEFAULT", "EFFICIENCY", "ZERO", "EFFICIENCY|ZERO"):
        for test in ("all_gather_perf", "reduce_scatter_perf"):
            for r in ("1", "2"):
                zero = "ZERO" in pol and r == "2" and test == "all_gather_perf"
                _reg(out, f"h100:{test}:CTA_POLICY={pol}:R{r}", test, ["-R", r], env={"NCCL_CTA_POLICY": pol},
                     sym=True, expect_error="NCCL_CTA_POLICY" if zero else None)  # fmt: skip
    # nccl-tests' other flags, with and without registration
    for where in (None, "testbed16"):
        for test in ("all_reduce_perf", "alltoall_perf"):
            for extra in FLAG_SETS if not quick else FLAG_SETS[:5]:
                _reg(out, f"{where or 'h100'}:{test}:{' '.join(extra)}", test, extra, topo=where, sym=True)
        for test in ("all_reduce_perf", "all_gather_perf"):  # -G, -m, -z with -R
            t = topo or "h100"
            for extra, err in (
                (["-G", "1", "-R", "0"], None),
                (["-G", "1", "-R", "1"], None),
                (["-G", "1", "-R", "2"], None),
                (["-m", "4", "-R", "0"], None),
                (["-m", "4", "-R", "1"], None),
                (["-m", "4", "-R", "2"], "-m"),
                (["-z", "1", "-R", "2"], None),
            ):
                pair = f"{t}:{test}:{' '.join(extra[:2])}"
                _reg(out, f"{pair}:R{extra[-1]}", test, extra, topo=topo, pair=pair, sym=True, expect_error=err)
    for env in ({"NCCL_CTA_POLICY": "1x"}, {"NCCL_CTA_POLICY": "EFFICIENCY", "PHANTORA_NCCL_VERSION": "2.29.2"}):
        tag = ",".join(f"{k}={v}" for k, v in env.items())  # NCCL reads the first digit; names from 2.29.2
        _reg(out, f"h100:all_gather_perf:{tag}:R1", "all_gather_perf", ["-R", "1"], env=env, sym=True)
    for value in ("3", "-1"):  # nccl-tests registers locally for any non-zero -R but 2; -x below 0 sets nothing
        _reg(out, f"h100:all_reduce_perf:R{value}", "all_reduce_perf", ["-R", value], sym=True)
    _reg(out, "h100:all_gather_perf:x-2", "all_gather_perf", ["-x", "-2", "-R", "1"], sym=True)
    for gpu in ("h100", "b200"):  # every type and op under -R 2
        for test in SYM_TESTS:
            _reg(out, f"{gpu}:{test}:R2:-d all", test, ["-R", "2", "-d", "all"], gpu=gpu, sym=True)
            if test != "all_gather_perf":
                _reg(out, f"{gpu}:{test}:R2:-o all", test, ["-R", "2", "-o", "all"], gpu=gpu, sym=True)
    # NCCL releases: PHANTORA_NCCL_VERSION 2.19 .. 2.30
    for ver in VERSIONS if not quick else VERSIONS[-3:]:
        env = {"PHANTORA_NCCL_VERSION": ver}
        for r in ("0", "1", "2"):
            _reg(out, f"h100:all_reduce:R{r}:v{ver}", "all_reduce_perf", ["-R", r], env=env,
                 pair=f"h100:all_reduce:v{ver}", sym=True)  # fmt: skip
        _reg(out, f"h100:reduce_scatter:R2:v{ver}", "reduce_scatter_perf", ["-R", "2"], env=env, sym=True)
        for test in ("all_gather_perf", "reduce_scatter_perf"):
            err = "PHANTORA_NCCL_VERSION" if ver == "2.29.2" and test == "all_gather_perf" else None
            _reg(out, f"testbed16:{test}:R2:v{ver}", test, ["-R", "2"], "testbed16", env=env, expect_error=err)
        _reg(out, f"a100:all_reduce:R2:v{ver}", "all_reduce_perf", ["-R", "2"], gpu="a100", env=env, sym=True)
    # bad input: one stderr line naming the flag or variable
    e1k = ["-b", "8", "-e", "1K"]
    bad = [
        ("Rx", ["-R", "x"], {}, "-R"),
        ("xfoo", ["-x", "foo"], {}, "-x"),
        ("policy", [], {"NCCL_CTA_POLICY": "FAST"}, "NCCL_CTA_POLICY"),
        (
            "policy-2.28",
            ["-R", "1"],
            {"NCCL_CTA_POLICY": "EFFICIENCY", "PHANTORA_NCCL_VERSION": "2.28"},
            "NCCL_CTA_POLICY",
        ),
        ("version", [], {"PHANTORA_NCCL_VERSION": "two"}, "PHANTORA_NCCL_VERSION"),
        ("version-old", [], {"PHANTORA_NCCL_VERSION": "2.10"}, "PHANTORA_NCCL_VERSION"),
        ("version-new", [], {"PHANTORA_NCCL_VERSION": "2.99"}, "PHANTORA_NCCL_VERSION"),
        ("register", [], {"PHANTORA_NCCL_REGISTER": "3"}, "PHANTORA_NCCL_REGISTER"),
        ("sym-kernel", ["-R", "2"], {"NCCL_SYM_KERNEL": "AllReduce_Fast"}, "NCCL_SYM_KERNEL"),
        ("sym-ctas", ["-R", "2"], {"NCCL_SYM_CTAS": "x"}, "NCCL_SYM_CTAS"),
        ("gin-off", ["-R", "2", "--topology", "testbed16"], {"NCCL_GIN_ENABLE": "0"}, "NCCL_GIN_ENABLE"),
        (
            "rs-chunk",
            ["-R", "2", "--topology", "testbed16"],
            {"NCCL_SYM_RS_GIN_CHUNK_SIZE": "x"},
            "NCCL_SYM_RS_GIN_CHUNK_SIZE",
        ),
        ("C-G", ["-C", "1", "-G", "1"], {}, "-C"),
        ("y-G", ["-y", "1", "-G", "1"], {}, "-y"),
        ("D1", ["-D", "1"], {}, "-D"),
        ("u-1", ["-u", "-1"], {}, "-u"),
        ("I-x", ["-I", "x"], {}, "-I"),
        ("T-x", ["-T", "x"], {}, "-T"),
        ("M-x", ["-M", "x"], {}, "-M"),
    ]
    for name, extra, env, want in bad:
        test = "reduce_scatter_perf" if name in ("gin-off", "rs-chunk") else "all_reduce_perf"
        out.append((Case(f"reg:bad:{name}", test, e1k + extra, env, want), None, None))
    return out


def ns3_cases() -> list[tuple[Case, str | None, str | None]]:
    """Each test at a few sizes on 4 hosts through both engines (compared by the caller); -R 2's symmetric kernels
    on one H100 server (NVLink flows through ns-3) and GIN kernels across testbed16's hosts, both engines."""
    out: list[tuple[Case, str | None, str | None]] = []
    for test in TESTS:
        for net in ("flow", "ns3"):
            a = ["-b", "8K", "-e", "8M", "-f", "32", "-n", "2", "-w", "1", "--topology", "@ls4x1", "--network", net]
            out.append((Case(f"ns3cmp:{test}:{net}", test, a), "@ls4x1", None))
    for topo, tests in ((None, SYM_TESTS), ("testbed16", SYM_TESTS[1:])):
        for test in tests:
            for net in ("flow", "ns3"):
                a = ["-b", "16K", "-e", "16M", "-f", "32", "-n", "2", "-w", "1", "-R", "2", "--network", net]
                a += ["--topology", topo] if topo else []
                out.append((Case(f"ns3cmp:R2:{topo or 'h100'}:{test}:{net}", test, a), topo, None))
    return out


def pair_violations(cases_by_name: dict[str, Case], tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """-R 1 against the same command at -R 0: on every line whose choice (algorithm, protocol, channels) is the
    same, registration only removes copies through NCCL's buffers, so the time may not grow."""
    runs: dict[str, dict[str, str]] = {}
    for name, c in cases_by_name.items():
        if c.pair and name in tables:
            runs.setdefault(c.pair, {})[flag_value(c.args, "-R", "0")] = name
    out: dict[str, list[str]] = {}
    for pair, by_r in runs.items():
        if "0" not in by_r or "1" not in by_r:
            continue
        for r0, r1 in zip(tables[by_r["0"]], tables[by_r["1"]], strict=False):
            if "bad" in r0 or "bad" in r1 or r0["size"] != r1["size"]:
                continue
            same = all(r0["choice"].get(k) == r1["choice"].get(k) for k in ("algorithm", "protocol", "channels"))
            if same and r1["time"] > r0["time"] + 0.011:
                out.setdefault(f"reg:pair:{pair}", []).append(
                    f"{r0['size']}B {r0['choice'].get('algorithm')}: -R 1 {r1['time']} us > -R 0 {r0['time']} us"
                )
    return out


def run_case(
    case: Case, scratch: Path, topo: str | None
) -> tuple[subprocess.CompletedProcess[str], Path, list[str], str | None]:
    """Run one case's command: (the process, its --out directory, the resolved arguments, the topology)."""

    def resolve(s: str) -> str:
        if s == "@JSON":
            return str(scratch / "json" / (case.name.replace("/", "_").replace(" ", "_")[:150] + ".json"))
        if s.startswith("@"):
            base = s[1:]
            return str(scratch / (base if base.endswith(".toml") else base + ".toml"))
        return s

    args = [resolve(x) for x in case.args]
    outdir = scratch / "out" / case.name.replace("/", "_").replace(" ", "_")[:150]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "PHANTORA_NCCL_"))}
    env.update(case.env)
    p = subprocess.run(
        PHANTORA + [case.test, *args, "--out", str(outdir), "--overwrite"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    return p, outdir, args, resolve(topo) if topo else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few topologies and variants")
    ap.add_argument("--ns3", action="store_true", help="also each test on ls4x1, and -R 2, through ns-3 against flow")
    ap.add_argument("--only", default="", help="run the cases whose name holds this")
    ap.add_argument("--reg-only", action="store_true", help="only the registration / flags / releases cases (reg:)")
    ap.add_argument("--jobs", type=int, default=1, help="commands run at once (default 1)")
    ap.add_argument("--log", default="", help="write every case's figures to this JSON file")
    opts = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="nccl_sweep_"))
    (scratch / "json").mkdir()
    for name, text in {**TOPOS_TOML, **BAD_TOML}.items():
        (scratch / (name if name.endswith(".toml") else name + ".toml")).write_text(text)
    todo = ([] if opts.reg_only else cases(opts.quick)) + reg_cases(opts.quick) + (ns3_cases() if opts.ns3 else [])
    todo = [c for c in todo if opts.only in c[0].name]
    bounds_cache: dict[tuple, Bounds] = {}
    failures: dict[str, list[str]] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    t0 = time.time()
    with ThreadPoolExecutor(max(1, opts.jobs)) as pool:
        futures = [pool.submit(run_case, case, scratch, topo) for case, topo, _ in todo]
        for (case, _, gpu), fut in zip(todo, futures, strict=True):
            p, outdir, args, topo_r = fut.result()
            b = None
            if case.expect_error is None and p.returncode == 0:
                key = (topo_r, gpu)
                if key not in bounds_cache:
                    bounds_cache[key] = topo_bounds(topo_r, gpu)
                b = bounds_cache[key]
            v = check_case(dataclasses.replace(case, args=args), p.returncode, p.stdout, p.stderr, outdir, b)
            if case.expect_error is None and p.returncode == 0:
                tables[case.name] = parse_table(
                    p.stdout, flag_value(case.args, "-I", "0") == "1", flag_value(case.args, "-S", "0") == "1"
                )
            if v:
                failures[case.name] = v
            print(f"{'FAIL' if v else 'ok  '} {case.name}", flush=True)
            for line in v[:6]:
                print(f"       {line}", flush=True)
            if len(v) > 6:
                print(f"       ... {len(v) - 6} more", flush=True)
    for name, v in pair_violations({c.name: c for c, _, _ in todo}, tables).items():
        failures[name] = v
        print(f"FAIL {name}\n       " + "\n       ".join(v[:6]), flush=True)
    if opts.ns3:
        for name in [n for n in tables if n.startswith("ns3cmp:") and n.endswith(":flow")]:
            base = name[: -len(":flow")]
            f, s = tables.get(name), tables.get(base + ":ns3")
            if not f or not s:
                continue
            for rf, rs in zip(f, s, strict=False):
                d = (rs["time"] - rf["time"]) / rf["time"] if rf["time"] else 0.0
                # ns-3's packets carry 1000 B of payload in 1048 and the NIC's wire also the ACKs of what it
                # receives (docs/nccl-tests.md, "Packet mode"): up to 9.6% slower where the NIC binds, then
                # docs/validation.md's 2% against the flow network at goodput with the ACK stream
                hi = GOODPUT_SLACK * 1.02 - 1
                mark = f"  <-- outside -2..+{hi:.1%}" if not -0.02 <= d <= hi else ""
                print(f"ns3 vs flow {base[7:]} {rf['size']}B: {rf['time']} / {rs['time']} us ({d:+.2%}){mark}")
                if mark:
                    failures.setdefault(base, []).append(f"{rf['size']}B {d:+.2%}")
    notes = {name: d for name, rows in tables.items() if (d := choice_switch_drops(rows))}
    if notes:
        print(f"\nnote: time falls with size across a change of NCCL's choice in {len(notes)} runs, e.g.")
        for name, d in list(notes.items())[:5]:
            print(f"  {name}: {d[0]}")
    if opts.log:
        Path(opts.log).write_text(json.dumps({"failures": failures, "tables": tables}, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)  # every run's --out directory
    print(f"\n{len(todo)} runs in {time.time() - t0:.0f} s; {len(failures)} with violations")
    for name, v in failures.items():
        print(f"  {name}: {v[0]}" + (f" (+{len(v) - 1})" if len(v) > 1 else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
