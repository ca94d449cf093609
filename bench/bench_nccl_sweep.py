"""Sweep `phantora nccl-tests` as a demanding user would and print every violation of physics or format.

Each case runs the command (`--out` to a scratch directory) and checks every table line: rc 0 and no
traceback; algbw x time = size; busbw = algbw x nccl-tests' factor; `#wrong` is 0 (N/A with -c 0); busbw at
most the hardware's cut bound (a GPU's own links: NVLink or PCIe plus its NIC, x 2(n-1)/n for an
all-reduce whose switch reduces (NVLS); a host's NICs for the bytes that must leave it); time non-decreasing
in size for one choice (algorithm, protocol, channels) within a block; results.json's choice equal to the
line's comment. Bad-input cases must give rc != 0 and one stderr line naming the flag, variable or file.

    .venv/bin/python bench/bench_nccl_sweep.py [--quick] [--ns3] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def busbw_bound(test: str, n: int, b: Bounds, algo: str, proto: str = "Simple") -> float:
    """The largest busbw (GB/s) the links allow for n ranks (host-major from rank 0) under the protocol's wire
    factor."""
    per_gpu = b.gpu_nvlink + b.gpu_pcie + b.gpu_nic
    f = FACTOR[test](n) if n > 1 else 1.0
    bound = per_gpu
    if test == "all_reduce_perf" and algo.startswith("NVLS"):
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


def parse_table(stdout: str) -> list[dict[str, Any]]:
    """The size lines: nccl-tests' 13 columns and the choice comment."""
    rows: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        body, _, comment = line.partition("#")
        f = body.split()
        if len(f) != 13:
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
                "ip": f[9:13],
                "choice": choice,
            }
        )
    return rows


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
    rows = parse_table(out)
    if not rows:
        return v + ["no table lines"]
    n = json.loads((outdir / "results.json").read_text())
    ranks = n["ranks"]
    sizes = n["sizes"]
    if len(sizes) != len(rows):
        v.append(f"results.json has {len(sizes)} sizes, table {len(rows)}")
    check_off = "-c" in case.args and case.args[case.args.index("-c") + 1] == "0"
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
        if t > 0:
            exp_alg = r["size"] / (t * 1e3)
            if abs(alg - exp_alg) > 0.006 + 1e-3 * exp_alg:
                v.append(f"{tag}: algbw {alg} != size/time {exp_alg:.3f}")
        exp_bus = (r["size"] / (t * 1e3) if t > 0 else 0.0) * FACTOR[case.test](ranks)
        if abs(bus - exp_bus) > 0.006 + 1e-3 * exp_bus:
            v.append(f"{tag}: busbw {bus} != algbw x factor {exp_bus:.3f}")
        if ranks == 1 and t > 0 and r["size"] > 0:
            hbm = get_gpu(n["topology"].get("gpu_model") or "h100").mem_bw / 1e9
            if alg > hbm / 2 * 1.0005 + 0.01:  # one rank: NCCL copies the buffer (read + write)
                v.append(f"{tag}: one rank's algbw {alg} above its memory's copy rate {hbm / 2:.1f} GB/s")
        if bounds is not None and r["size"] > 0 and ranks > 1:
            ch = r["choice"]
            cap = busbw_bound(case.test, ranks, bounds, ch.get("algorithm", ""), ch.get("protocol", "Simple"))
            if bus > cap * 1.0005 + 0.01:
                v.append(f"{tag}: busbw {bus} above the links' {cap:.2f} GB/s ({r['choice'].get('algorithm')})")
        if i < len(sizes):
            s = sizes[i]
            rc_choice = {k: str(val) for k, val in (s.get("choice") or {}).items()}
            for k in ("algorithm", "protocol", "channels"):
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
        if key in last and r["size"] > last[key][0] and t + 0.011 < last[key][1]:
            v.append(f"{tag}: time {t} below {last[key][1]} at {last[key][0]}B, same choice")
        last[key] = (r["size"], t)
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


def ns3_cases() -> list[tuple[Case, str | None, str | None]]:
    """Each test at a few sizes on 4 hosts through both engines (compared by the caller)."""
    out: list[tuple[Case, str | None, str | None]] = []
    for test in TESTS:
        for net in ("flow", "ns3"):
            a = ["-b", "8K", "-e", "8M", "-f", "32", "-n", "2", "-w", "1", "--topology", "@ls4x1", "--network", net]
            out.append((Case(f"ns3cmp:{test}:{net}", test, a), "@ls4x1", None))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few topologies and variants")
    ap.add_argument("--ns3", action="store_true", help="also each test on ls4x1 through ns-3 against flow")
    ap.add_argument("--only", default="", help="run the cases whose name holds this")
    ap.add_argument("--log", default="", help="write every case's figures to this JSON file")
    opts = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="nccl_sweep_"))
    for name, text in {**TOPOS_TOML, **BAD_TOML}.items():
        (scratch / (name if name.endswith(".toml") else name + ".toml")).write_text(text)
    todo = cases(opts.quick) + (ns3_cases() if opts.ns3 else [])
    todo = [c for c in todo if opts.only in c[0].name]
    bounds_cache: dict[tuple, Bounds] = {}
    failures: dict[str, list[str]] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    t0 = time.time()
    for case, topo, gpu in todo:

        def resolve(s: str) -> str:
            if s.startswith("@"):
                base = s[1:]
                return str(scratch / (base if base.endswith(".toml") else base + ".toml"))
            return s

        args = [resolve(x) for x in case.args]
        topo_r = resolve(topo) if topo else None
        outdir = scratch / "out" / case.name.replace("/", "_").replace(" ", "_")[:150]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        env.update(case.env)
        p = subprocess.run(
            PHANTORA + [case.test, *args, "--out", str(outdir), "--overwrite"],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        b = None
        if case.expect_error is None and p.returncode == 0:
            key = (topo_r, gpu)
            if key not in bounds_cache:
                bounds_cache[key] = topo_bounds(topo_r, gpu)
            b = bounds_cache[key]
        v = check_case(case, p.returncode, p.stdout, p.stderr, outdir, b)
        if case.expect_error is None and p.returncode == 0:
            tables[case.name] = parse_table(p.stdout)
        if v:
            failures[case.name] = v
        print(f"{'FAIL' if v else 'ok  '} {case.name}", flush=True)
        for line in v[:6]:
            print(f"       {line}", flush=True)
        if len(v) > 6:
            print(f"       ... {len(v) - 6} more", flush=True)
    if opts.ns3:
        for test in TESTS:
            f, s = tables.get(f"ns3cmp:{test}:flow"), tables.get(f"ns3cmp:{test}:ns3")
            if not f or not s:
                continue
            for rf, rs in zip(f, s, strict=False):
                d = (rs["time"] - rf["time"]) / rf["time"] if rf["time"] else 0.0
                # ns-3's packets carry 1000 B of payload in 1048 and the NIC's wire also the ACKs of what it
                # receives (docs/nccl-tests.md, "Packet mode"): up to 9.6% slower where the NIC binds, then
                # docs/validation.md's 2% against the flow network at goodput with the ACK stream
                hi = GOODPUT_SLACK * 1.02 - 1
                flag = f"  <-- outside -2..+{hi:.1%}" if not -0.02 <= d <= hi else ""
                print(f"ns3 vs flow {test} {rf['size']}B: {rf['time']} / {rs['time']} us ({d:+.2%}){flag}")
                if flag:
                    failures.setdefault(f"ns3cmp:{test}", []).append(f"{rf['size']}B {d:+.2%}")
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
