"""Audit `phantora nccl-tests` as a new user would run it: every program x GPU x topology x a few flags.

Each case runs the command in this process (stdout and stderr captured, NCCL_* variables set for the case) and is
checked for: no traceback (a refusal is one stderr line naming a flag or variable); a table whose data rows have
nccl-tests' 13 columns (size count type redop root, then time algbw busbw #wrong out of place and in place);
every size's choice in results.json; busbw never above the hardware's bound (`bound`); busbw that does not fall
by more than 2% from one size to the next under one algorithm, protocol and channel count; a forced NCCL_ALGO /
NCCL_PROTO honoured or refused (NCCL_PROTO: collectives only). Findings are printed one a line and, with --json,
written out.

    cd bench && ../.venv/bin/python audit_nccl_tests.py --set base      # programs x GPUs x topologies
    ../.venv/bin/python audit_nccl_tests.py --set flags                 # flags and forced NCCL choices
    ../.venv/bin/python audit_nccl_tests.py --set ns3 --limit 20        # a seeded sample through ns-3

Bounds (busbw, GB/s; nv: the GPU's NVLink or PCIe link, nic: its NIC, G GPUs a host, H hosts, n ranks): within
one host nv, an NVLS (or -R 2 symmetric, H100 on) all-reduce 2(n-1)/n nv (each GPU sends and receives S once,
the switch reduces); across hosts also what each host's G NICs carry: ring all-reduce, broadcast, reduce G nic
(each host sends its whole share through them), tree / NVLS-tree / CollNet all-reduce 2(n-1)/n G nic (S up and S
down a host), all-gather and reduce-scatter (n-1)/n H/(H-1) G nic, all-to-all (n-1)/(n-G) nic, send/recv G nic
(PXN may spread a GPU's sends over its host's NICs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.cli import main
from phantora.topology import load_topology

PROGRAMS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")
GPUS = ("a100", "h100", "h200", "b200")
SIZES = ("-b", "8", "-e", "1G", "-f", "2")  # 8 B to 1 GiB, every power of two (1 MiB among them)
FLAG_SIZES = ("-b", "8", "-e", "1G", "-f", "8")
NS3_SIZES = ("-b", "8", "-e", "1M", "-f", "131072")  # 8 B and 1 MiB: 1 GiB through ns-3 takes minutes a case
TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16", "f8e4m3",
         "f8e5m2", "char", "int", "uint"}  # fmt: skip
# NCCL_PROTO does not reach sends and receives: NCCL allocates every protocol's buffers and runs LL up to
# nChannels x NCCL_P2P_LL_THRESHOLD (16 KiB), Simple above (enqueue.cc, v2.28.3-1), as phantora does
P2P_PROGRAMS = {"alltoall", "sendrecv"}


@dataclass
class Case:
    prog: str
    gpu: str
    topo: str  # a shipped name or a generator key of TOPOS
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    sizes: tuple[str, ...] = SIZES
    network: str = "flow"

    def label(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        net = "" if self.network == "flow" else " --network " + self.network
        return f"{env + ' ' if env else ''}{self.prog}_perf {' '.join(self.argv)} --gpu {self.gpu} [{self.topo}]{net}"


# name -> (--topology value or a generator's TOML body, extra argv)
TOPOS: dict[str, tuple[str, list[str]]] = {
    "dgx2": ('[generator]\nkind = "dgx_host"\ngpus_per_host = 2\n', []),
    "dgx4": ('[generator]\nkind = "dgx_host"\ngpus_per_host = 4\n', []),
    "dgx8": ('[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n', []),
    "testbed16": ("testbed16", []),
    "rail128x2": ("rail128", ["--np", "16"]),
    "rail128x4": ("rail128", ["--np", "32"]),
    "leafspine1024x2": ("leafspine1024", ["--np", "16"]),
    "leafspine1024x4": ("leafspine1024", ["--np", "32"]),
    "pcie8": ('gpu = "a100-pcie"\n[generator]\nkind = "pcie_host"\ngpus_per_host = 8\nsockets = 2\n', []),
}
FLAGS: list[tuple[list[str], dict[str, str]]] = [
    (["--np", "1", "-g", "8"], {}),
    (["--np", "4", "-t", "2"], {}),
    (["-d", "all"], {}),
    (["-o", "all"], {}),
    (["-r", "-1"], {}),
    (["-z", "1"], {}),
    (["-G", "1"], {}),
    (["-N", "2"], {}),
    (["-c", "0"], {}),
    (["-w", "0"], {}),
    (["-m", "2"], {}),
    (["-R", "1"], {}),
    (["-R", "2"], {}),
    *[([], {"NCCL_ALGO": a}) for a in ("Ring", "Tree", "NVLS", "NVLSTree", "CollnetDirect", "CollnetChain", "PAT")],
    *[([], {"NCCL_PROTO": p}) for p in ("LL", "LL128", "Simple")],
    ([], {"NCCL_MAX_NCHANNELS": "1"}),
]


def topo_arg(name: str, gpu: str, tmp: Path) -> tuple[str, list[str]]:
    spec, extra = TOPOS[name]
    if "\n" not in spec:
        return spec, extra
    path = tmp / f"{name}.toml"
    if not path.exists():
        path.write_text(f'name = "{name}"\n' + spec)
    return str(path), extra


def link_rates(topo_spec: str, nranks: int) -> tuple[float, float, int, int]:
    """(nv, nic) in GB/s, GPUs a host, hosts among the first `nranks` ranks."""
    topo = load_topology(topo_spec)
    kinds = {n.id: n.kind for n in topo.nodes}
    nv = nic = 0.0
    gpus = [topo.node_of_rank(r) for r in range(nranks)]
    for link in topo.links:
        for a, b in ((link.a, link.b), (link.b, link.a)):
            if a == gpus[0]:
                gbs = link.bandwidth_bps / 8e9
                if kinds[b] in ("nvswitch",) or kinds[b] == "gpu":
                    nv = max(nv, gbs)
                elif kinds[b] in ("pcie_switch", "cpu") or "pci" in str(kinds[b]):
                    nv = max(nv, gbs)
                else:
                    nic = max(nic, gbs)
    hosts: dict[int, int] = {}
    for g in gpus:
        h = topo.nodes[g].host
        key = -1 if h is None else h
        hosts[key] = hosts.get(key, 0) + 1
    return nv or nic, nic, max(hosts.values()), len(hosts)


def bound(prog: str, algo: str, n: int, nv: float, nic: float, g: int, h: int, multicast: bool) -> float:
    """The most busbw the links allow (GB/s); see the module's docstring. `multicast`: the GPUs' NVSwitch reduces
    (H100 and later), so NVLS and the symmetric kernels (-R 2, "sym") may use it."""
    nvls = algo.upper().startswith("NVLS") or (multicast and algo == "sym")
    b = nv * 2 * (n - 1) / n if prog == "all_reduce" and nvls else nv
    if h > 1:
        if prog == "all_reduce":
            ring = algo.upper() == "RING"
            b = min(b, g * nic if ring else 2 * (n - 1) / n * g * nic)
        elif prog in ("all_gather", "reduce_scatter"):
            b = min(b, (n - 1) / n * h / (h - 1) * g * nic)
        elif prog == "alltoall":
            b = min(b, (n - 1) / (n - g) * nic)
        else:
            b = min(b, g * nic)
    return b


def parse_table(out: str) -> tuple[list[list[str]], list[str]]:
    """Data rows of an nccl-tests table, and what is wrong with its rows."""
    rows, bad = [], []
    for line in out.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        body = line.split("#", 1)[0].split()
        if len(body) != 13:
            bad.append(f"{len(body)} columns: {line[:100]!r}")
            continue
        try:
            int(body[0]), int(body[1]), int(body[4])
            [float(x) for x in (*body[5:8], *body[9:12])]
        except ValueError:
            bad.append(f"unparsable: {line[:100]!r}")
            continue
        if body[2] not in TYPES or body[8] not in ("0", "N/A") or body[12] not in ("0", "N/A"):
            bad.append(f"type or #wrong: {line[:100]!r}")
        rows.append(body)
    return rows, bad


def run_case(case: Case, tmp: Path) -> tuple[int, str, str, dict[str, Any] | None, float, str | None]:
    """(rc, stdout, stderr, results.json, cpu s, traceback) of one case."""
    spec, extra = topo_arg(case.topo, case.gpu, tmp)
    out = tmp / f"run{time.monotonic_ns()}"
    argv = ["nccl-tests", f"{case.prog}_perf", *case.sizes, "-n", "2", *extra, *case.argv, "--topology", spec]
    argv += ["--gpu", case.gpu, "--network", case.network, "--out", str(out)]
    saved = {k: os.environ.get(k) for k in case.env}
    os.environ.update(case.env)
    so, se = io.StringIO(), io.StringIO()
    tb = None
    cpu = time.process_time()
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception:  # noqa: BLE001 - a traceback is a finding
        rc, tb = -1, traceback.format_exc()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cpu = time.process_time() - cpu
    res = out / "results.json"
    data = json.loads(res.read_text()) if res.exists() else None
    return rc, so.getvalue(), se.getvalue(), data, cpu, tb


def check(case: Case, tmp: Path) -> tuple[list[str], dict[str, Any]]:
    """Findings of one case, and a summary row."""
    rc, out, err, data, cpu, tb = run_case(case, tmp)
    found: list[str] = []
    row: dict[str, Any] = {"case": case.label(), "rc": rc, "cpu_s": round(cpu, 2)}
    if tb is not None:
        return [f"traceback: {tb.strip().splitlines()[-1]}"], row | {"traceback": tb}
    if rc != 0:
        lines = [x for x in err.splitlines() if x.strip() and not x.startswith("#")]
        row["refusal"] = lines[-1] if lines else ""
        if len(lines) != 1 or "error" not in lines[0]:
            found.append(f"refusal is not one error line: {lines[:3]}")
        return found, row
    rows, bad = parse_table(out)
    found += [f"table: {b}" for b in bad[:3]]
    if not rows:
        found.append("no table rows")
    if data is None:
        return [*found, "no results.json"], row
    sizes = data["sizes"]
    n = int(data["ranks"]) if isinstance(data["ranks"], int) else len(data["ranks"])
    spec, _ = topo_arg(case.topo, case.gpu, tmp)
    nv, nic, g, h = link_rates(spec, n)
    row |= {"ranks": n, "hosts": h, "nv_gbs": nv, "nic_gbs": nic}
    top = 0.0
    prev: dict[tuple[Any, ...], dict[str, Any]] = {}
    for s in sizes:
        choice = s.get("choice") or {}
        algo, proto = str(choice.get("algorithm", "")), str(choice.get("protocol", ""))
        if not algo and s["bytes"] > 0:  # 0 B: NCCL runs nothing (nccl-tests still prints the row)
            found.append(f"{s['bytes']} B: no algorithm in results.json's choice")
        lim = bound(case.prog, algo, n, nv, nic, g, h, case.gpu != "a100" and case.topo != "pcie8")
        top = max(top, s["busbw"])
        if s["busbw"] > lim * 1.001:
            found.append(f"{s['bytes']} B: busbw {s['busbw']:.2f} > bound {lim:.2f} GB/s ({algo}/{proto})")
        key = (s.get("datatype"), s.get("redop"), s.get("root"), algo, proto, choice.get("channels"))
        p = prev.get(key)
        if p is not None and s["bytes"] > p["bytes"] and s["busbw"] < p["busbw"] * 0.98:
            found.append(
                f"{p['bytes']} -> {s['bytes']} B: busbw falls {p['busbw']:.3f} -> {s['busbw']:.3f} ({algo}/{proto})"
            )
        prev[key] = s
        forced_algo, forced_proto = case.env.get("NCCL_ALGO"), case.env.get("NCCL_PROTO")
        if forced_algo and algo and algo.lower() != forced_algo.lower() and "p2p" not in algo.lower():
            found.append(f"{s['bytes']} B: NCCL_ALGO={forced_algo} ran {algo}")
        if forced_proto and proto and proto.lower() != forced_proto.lower() and case.prog not in P2P_PROGRAMS:
            found.append(f"{s['bytes']} B: NCCL_PROTO={forced_proto} ran {proto}")
    row["max_busbw"] = round(top, 2)
    return found, row


def cases(which: str) -> list[Case]:
    out: list[Case] = []
    if which == "base":
        for topo in TOPOS:
            gpus = ("a100",) if topo == "pcie8" else GPUS
            out += [Case(p, gpu, topo) for p in PROGRAMS for gpu in gpus]
    elif which == "flags":
        for topo, gpu in (("dgx8", "h100"), ("rail128x2", "h100"), ("testbed16", "a100")):
            out += [Case(p, gpu, topo, argv, env, FLAG_SIZES) for argv, env in FLAGS for p in PROGRAMS]
    elif which == "fast":  # the slice tests/test_nccl_tests_audit.py runs
        out = [Case(p, "h100", "dgx8", [], {}, FLAG_SIZES) for p in PROGRAMS]
    elif which == "ns3":
        pool = cases("base") + cases("flags")
        pool = [c for c in pool if c.topo != "pcie8" and "rail128x4" not in c.topo and "x4" not in c.topo]
        out = random.Random(33).sample(pool, 20)
        for c in out:
            c.network, c.sizes = "ns3", NS3_SIZES
    return out


def run(which: str, limit: int | None, only: str | None) -> tuple[list[dict[str, Any]], int]:
    todo = [c for c in cases(which) if only is None or only in c.label()][:limit]
    rows, nfound = [], 0
    with tempfile.TemporaryDirectory(prefix="audit_nccl_") as d:
        tmp = Path(d)
        for i, case in enumerate(todo):
            found, row = check(case, tmp)
            row["findings"] = found
            rows.append(row)
            nfound += bool(found)
            mark = "FIND" if found else ("refused" if row["rc"] else "ok")
            print(f"[{i + 1}/{len(todo)}] {mark:7s} {row['cpu_s']:6.2f}s {case.label()}", flush=True)
            for f in found[:6]:
                print(f"      {f}", flush=True)
            if row.get("refusal"):
                print(f"      {row['refusal']}", flush=True)
    return rows, nfound


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", dest="which", default="fast", choices=("base", "flags", "ns3", "fast"))
    ap.add_argument("--limit", type=int, default=None, help="run the first N cases only")
    ap.add_argument("--only", default=None, help="run the cases whose label holds this text")
    ap.add_argument("--json", default=None, help="write the rows (findings, refusals, CPU s) here")
    a = ap.parse_args()
    rows, nfound = run(a.which, a.limit, a.only)
    refused = sum(1 for r in rows if r["rc"] and not r["findings"])
    cpu = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} cases: {nfound} with findings, {refused} refused in one line, {cpu:.1f} CPU s")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 1 if nfound else 0


if __name__ == "__main__":
    sys.exit(cli())
