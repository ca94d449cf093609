"""Live torch.distributed programs through phantora's NCCL model, checked as a network researcher would check them.

    .venv/bin/python bench/bench_nccl_live_sweep.py [--jobs 2] [--only TEXT] [--ns3] [--keep DIR [--reuse]]

Every run is `phantora run --topology T [--network ns3] tests/data/nccl_live/ops.py OP:BYTES[@GROUP][%ENV] ...` (one
call of each torch.distributed operation that becomes NCCL traffic: all_reduce and its coalesced form, all_gather
and all_gather_into_tensor, reduce_scatter(_tensor), all_to_all(_single, uneven splits), broadcast, reduce, gather,
scatter, send/recv, isend/irecv, batch_isend_irecv, barrier, new_group and split_group subgroups, the functional
collectives, a DTensor redistribute) under NCCL's variables, set in the run's environment or by the program before
it creates a group, on testbed16 (2 x 8 H100), one 8-GPU H100 host and one 8-GPU A100 host, under a wall-clock
timeout. Each collective the run records (cosim.json) is a case, checked against:

- choice: NCCL's choice (algorithm, protocol, channels and the model's latency, bandwidth and time) equals what
  `phantora nccl-tests` prints for the same test, size, ranks, topology and variables (that command is checked
  against NCCL's own tables: docs/nccl-tests.md). A subgroup's is the choice on its own ranks' topology: ranks 0..k-1
  of a host are `--np k`, a whole host of testbed16 is the one-host topology, one GPU of each host is two one-GPU
  hosts on the same NICs;
- wire: the bytes of the collective's flows (flows.csv) are the protocol's wire factor (LL 2, LL128 16/15, Simple 1)
  times the algorithm's bytes, in closed form (n ranks, m GPUs a host, N hosts, S the nccl-tests size): ring
  all-reduce 2(n-1)S, tree 2(n-1)S, NVLS N(m+1)S, NVLS-Tree N(m+1)S + 2(N-1)S; ring / NVLS / PAT all-gather and
  reduce-scatter (n-1)S; broadcast and reduce chains (n-1)S; all-to-all (n-1)S; a send S;
- forced: a variable the run sets is honoured (NCCL_ALGO / NCCL_PROTO: the choice is among the allowed ones;
  NCCL_MAX_NCHANNELS: no more ring or tree channels) or refused with one line naming it (no traceback);
- all-to-all: equal parts given as lists take the time of all_to_all_single of the same bytes (NCCL runs both as one
  group of sends and receives);
- deterministic: the base programs run twice and give identical results.json (but its host figures: wall time,
  memory of the host processes), cosim.json collectives and flows.csv.

A table of cases (pass / fail and why) and the counts are printed; the exit code is 1 if any case fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHANTORA = [sys.executable, "-m", "phantora.cli"]
OPS = ROOT / "tests" / "data" / "nccl_live" / "ops.py"
WIRE = {"LL": 2.0, "LL128": 16 / 15, "Simple": 1.0}
TEST_OF = {
    "all_reduce": "all_reduce_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "all_to_all": "alltoall_perf",
    "send_recv": "sendrecv_perf",
}
CHOICE_KEYS = ("algorithm", "protocol", "channels", "model_lat_us", "model_algbw_gbs", "model_time_us")
HOST_FIGURES = ("wall_s", "peak_rss_mb_total", "pss_mb_total", "rss", "pss", "time", "wall")
TOPOLOGIES = {
    "h100x8": 'name = "h100x8"\ngpu = "h100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n',
    "a100x8": 'name = "a100x8"\ngpu = "a100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n',
    # one GPU of each testbed16 host: two one-GPU hosts on the same 400G NICs, leaf and spines
    "h100x1x2": (
        'name = "h100x1x2"\ngpu = "h100"\n[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 1\n'
        'spines = 4\ngpus_per_host = 1\nnic_rate = "400Gbps"\nuplink_rate = "800Gbps"\nlatency = "1us"\n'
    ),
}
HOSTS = {"testbed16": (16, 8), "h100x8": (8, 8), "a100x8": (8, 8), "h100x1x2": (2, 1)}  # ranks, GPUs a host

# every call once; sizes powers of two (nccl-tests' sizes), distinct enough to cross NCCL's protocol switches
ALL_OPS = (
    "all_reduce:4M",
    "all_reduce_coalesced:1M",
    "all_gather_into_tensor:2M",
    "all_gather:64K",
    "reduce_scatter_tensor:2M",
    "reduce_scatter:64K",
    "all_to_all_single:1M",
    "all_to_all_uneven:1M",
    "all_to_all:1M",
    "broadcast:1M",
    "reduce:256K",
    "gather:1M",
    "scatter:1M",
    "send_recv:1M",
    "isend_irecv:64K",
    "batch_isend_irecv:1M",
    "barrier:0",
    "funcol_all_reduce:32M",
    "funcol_all_gather:8M",
    "funcol_reduce_scatter:8M",
    "funcol_all_to_all:8M",
    "dtensor_redistribute:4M",
)
SUBGROUPS = {
    "testbed16": (
        "all_reduce:4M@split:1",
        "all_gather_into_tensor:1M@0.8",
        "all_reduce:16M@0.8",
        "all_reduce:4M@0.1.2.3",
        "reduce_scatter_tensor:1M@0.8%NCCL_ALGO=PAT",  # PAT: one GPU a host; set by the program for its group
    ),
    "h100x8": ("all_reduce:4M@0.1.2.3", "all_gather_into_tensor:1M@0.1", "reduce_scatter_tensor:8M@split:0"),
    "a100x8": ("all_reduce:4M@0.1.2.3", "all_gather_into_tensor:1M@0.1"),
}


ONLY = {"Tree": ("all_reduce",), "PAT": ("all_gather", "reduce_scatter")}  # NCCL has these for no other collective


@dataclass
class Run:
    name: str
    topo: str
    ops: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    network: str = "flow"
    twice: bool = False  # run it again: the determinism check
    refuse: str = ""  # the run must fail with one line naming this


def runs(ns3: bool) -> list[Run]:
    out: list[Run] = []
    for topo in ("testbed16", "h100x8", "a100x8"):
        out.append(Run(f"{topo}:all", topo, ALL_OPS, twice=True))
        out.append(
            Run(
                f"{topo}:groups",
                topo,
                SUBGROUPS[topo],
                env={"PHANTORA_LIVE_BLOCK": "8" if topo == "testbed16" else "4"},
            )
        )
        coll = (
            "all_reduce:4M",
            "all_reduce:64K",
            "all_gather_into_tensor:8M",
            "reduce_scatter_tensor:8M",
            "broadcast:4M",
        )
        forced = [
            {"NCCL_ALGO": "Ring"},
            {"NCCL_ALGO": "Tree"},
            {"NCCL_PROTO": "Simple"},
            {"NCCL_PROTO": "LL"},
            {"NCCL_MAX_NCHANNELS": "4"},
            {"NCCL_MIN_NCHANNELS": "32", "NCCL_ALGO": "Ring"},
            {"NCCL_NVLS_ENABLE": "0"},
            {"NCCL_BUFFSIZE": "1048576"},
            {"PHANTORA_NCCL_VERSION": "2.21"},
        ]
        if topo == "testbed16":
            forced += [{"NCCL_PXN_DISABLE": "1"}, {"NCCL_P2P_NET_CHUNKSIZE": "524288"}]
        for env in forced:
            tag = ",".join(f"{k}={v}" for k, v in env.items())
            ops = coll + (("all_to_all_single:1M", "batch_isend_irecv:1M") if "P2P" in tag or "PXN" in tag else ())
            if env.get("NCCL_ALGO") in ONLY:  # the collectives NCCL runs that algorithm for
                ops = tuple(o for o in ops if o.startswith(ONLY[env["NCCL_ALGO"]]))
            out.append(Run(f"{topo}:{tag}", topo, ops, env=env))
        # a variable the program sets before it creates a group: that group's collectives only
        out.append(
            Run(f"{topo}:program-env", topo, ("all_reduce:4M%NCCL_ALGO=Ring,NCCL_PROTO=Simple", "all_reduce:4M"))
        )
        out.append(
            Run(
                f"{topo}:register",
                topo,
                ("all_reduce:4M", "all_gather_into_tensor:8M"),
                env={"PHANTORA_NCCL_REGISTER": "1"},
            )
        )
    # refusals: one line naming the variable (NCCL: "no algorithm/protocol available", ncclInvalidUsage)
    for algo, op in (("Tree", "all_gather_into_tensor:8M"), ("PAT", "all_reduce:4M")):
        name = f"testbed16:refuse NCCL_ALGO={algo} {op}"
        out.append(Run(name, "testbed16", (op,), env={"NCCL_ALGO": algo}, refuse="NCCL_ALGO"))
    for topo, var, value in (
        ("a100x8", "NCCL_ALGO", "NVLS"),
        ("h100x8", "NCCL_PROTO", "bogus"),
        ("h100x8", "NCCL_BUFFSIZE", "1"),
        ("h100x8", "PHANTORA_NCCL_VERSION", "2.10"),
    ):
        out.append(Run(f"{topo}:refuse {var}={value}", topo, ("all_reduce:4M",), env={var: value}, refuse=var))
    if ns3:
        small = ("all_reduce:4M", "all_gather_into_tensor:2M", "all_to_all_single:1M", "send_recv:1M", "barrier:0")
        out.append(Run("testbed16:ns3", "testbed16", small, network="ns3", twice=True))
        out.append(Run("h100x8:ns3", "h100x8", small, network="ns3"))
    return out


# ----- running ------------------------------------------------------------------------------------------------------
def topo_arg(topo: str, work: Path) -> str:
    if topo in TOPOLOGIES:
        path = work / f"{topo}.toml"
        if not path.exists():
            path.write_text(TOPOLOGIES[topo])
        return str(path)
    return topo


REUSE = [False]  # --reuse: take a run directory that completed instead of running it again


def launch(run: Run, work: Path, out: Path, timeout_s: float) -> tuple[int, str, float]:
    if REUSE[0] and (out / "status.json").exists():
        if json.loads((out / "status.json").read_text()).get("state") == "complete":
            return 0, "", 0.0
    cmd = [*PHANTORA, "run", "--topology", topo_arg(run.topo, work), "--network", run.network, "--out", str(out)]
    cmd += ["--overwrite", "--timeout", str(int(timeout_s)), "--no-progress", str(OPS), *run.ops]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env={**os.environ, **run.env}, capture_output=True, text=True, timeout=timeout_s + 30)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = -9, f"no end within {timeout_s + 30:.0f} s"
    return rc, err, time.monotonic() - t0


_NT_CACHE: dict[tuple, dict | str] = {}


def nccl_tests_choice(kind: str, nbytes: int, np_: int, topo: str, env: dict[str, str], work: Path) -> dict | str:
    """NCCL's choice as `phantora nccl-tests` prints it for one size (its line's trailing comment), or an error."""
    key = (kind, nbytes, np_, topo, tuple(sorted(env.items())))
    if key in _NT_CACHE:
        return _NT_CACHE[key]
    cmd = [*PHANTORA, "nccl-tests", TEST_OF[kind], "-b", str(nbytes), "-e", str(nbytes), "-n", "1", "-w", "0"]
    cmd += ["-d", "float", "--topology", topo_arg(topo, work), "--np", str(np_)]
    p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.startswith("#") and "algorithm=" in ln]
    if p.returncode != 0 or not lines:
        got: dict | str = f"nccl-tests rc {p.returncode}: {p.stderr.strip()[-200:]}"
    else:
        got = {}
        for kv in lines[0].split("#", 1)[1].split():
            k, _, v = kv.partition("=")
            got[k] = float(v) if re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", v) else v
    _NT_CACHE[key] = got
    return got


# ----- checks -------------------------------------------------------------------------------------------------------
def flow_bytes(out: Path) -> dict[int, int]:
    with open(out / "flows.csv") as f:
        return {int(r["flow_id"]): int(r["size_bytes"]) for r in csv.DictReader(f)}


def alg_bytes(rec: dict, hosts_of: dict[int, int]) -> float | None:
    """The algorithm's bytes before the protocol's factor (the module docstring's closed forms; size S, hosts N)."""
    kind, alg, size = rec["kind"], rec["nccl"]["algorithm"], rec["nbytes"]
    ranks = rec["group"]
    n = len(ranks)
    per_host: dict[int, int] = defaultdict(int)
    for r in ranks:
        per_host[hosts_of[r]] += 1
    hosts, m = len(per_host), max(per_host.values())
    if kind == "send_recv":
        return size
    if kind == "all_reduce":
        if alg in ("Ring", "Tree"):
            return 2 * (n - 1) * size
        if alg == "NVLS":
            return hosts * (m + 1) * size
        if alg == "NVLSTree":
            return hosts * (m + 1) * size + 2 * (hosts - 1) * size
        return None
    if kind in ("all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
        return (n - 1) * size
    return None


def check_record(rec: dict, sizes: dict[int, int], hosts_of: dict[int, int]) -> str:
    choice = rec.get("nccl") or {}
    if "protocol" not in choice:
        return ""
    if choice.get("algorithm") == "sym" or rec.get("copies", 1) != 1:
        return ""
    expect = alg_bytes(rec, hosts_of)
    if expect is None:
        return f"no closed form for {rec['kind']} {choice.get('algorithm')}"
    got = sum(sizes.get(i, 0) for i in range(rec["first_flow"], rec["first_flow"] + rec["flows"]))
    want = expect * WIRE[choice["protocol"]]
    tol = max(0.002 * want, 128 * rec["flows"])
    if abs(got - want) > tol:
        return f"wire {got} B, closed form {want:.0f} B ({choice['algorithm']}/{choice['protocol']})"
    return ""


def allowed(env: dict[str, str], name: str, kind: str) -> set[str] | None:
    """NCCL_ALGO / NCCL_PROTO's allowed names for `kind` (NCCL's list syntax: `^` excludes, `kind:list;...`)."""
    text = env.get(name)
    if text is None:
        return None
    for part in text.split(";"):
        head, _, lst = part.rpartition(":")
        if head and head.replace("_", "").lower() != kind.replace("_", "").lower():
            continue
        names = {x.strip().lower() for x in lst.lstrip("^").split(",")}
        return {"^" + x for x in names} if lst.startswith("^") else names
    return None


def forced_ok(rec: dict, env: dict[str, str]) -> str:
    ch = rec.get("nccl") or {}
    kind = rec["kind"]
    if kind in ("send_recv", "all_to_all") or "protocol" not in ch:
        return ""
    for var, key in (("NCCL_ALGO", "algorithm"), ("NCCL_PROTO", "protocol")):
        names = allowed(env, var, kind)
        if names is None:
            continue
        have = str(ch[key]).lower()
        if any(x.startswith("^") for x in names) and "^" + have in names:
            return f"{var}={env[var]} not honoured: {ch[key]}"
        if not any(x.startswith("^") for x in names) and have not in names:
            return f"{var}={env[var]} not honoured: {ch[key]}"
    if "NCCL_MAX_NCHANNELS" in env and ch["algorithm"] in ("Ring", "Tree", "PAT"):
        if ch["channels"] > max(int(env["NCCL_MAX_NCHANNELS"]), int(env.get("NCCL_MIN_NCHANNELS", 0))):
            return f"NCCL_MAX_NCHANNELS={env['NCCL_MAX_NCHANNELS']} not honoured: {ch['channels']} channels"
    if env.get("NCCL_NVLS_ENABLE") == "0" and ch["algorithm"] in ("NVLS", "NVLSTree"):
        return f"NCCL_NVLS_ENABLE=0 not honoured: {ch['algorithm']}"
    return ""


def nt_reference(rec: dict, run: Run) -> tuple[str, int] | None:
    """(topology, --np) on which `phantora nccl-tests` runs this record's collective on the same ranks' topology, or
    None where nccl-tests has no such test (uneven all-to-all, gather, scatter parts; a lone send's pair)."""
    ranks = rec["group"]
    n = len(ranks)
    kind = rec["kind"]
    if kind == "send_recv":
        return None
    if str(rec["name"]).split("#")[0] in ("gather", "scatter"):
        return None
    if ranks == list(range(n)):
        return run.topo, n
    if run.topo == "testbed16" and ranks == list(range(8, 16)):
        return "h100x8", 8
    if run.topo == "testbed16" and ranks == [0, 8]:
        return "h100x1x2", 2
    return None


def record_cases(run: Run, out: Path, work: Path) -> list[tuple[str, str]]:
    cosim = json.loads((out / "cosim.json").read_text())
    sizes = flow_bytes(out)
    n_ranks, per = HOSTS[run.topo]
    hosts_of = {r: r // per for r in range(n_ranks)}
    cases: dict[str, str] = {}
    for rec in cosim["collectives"]:
        name = f"{rec['name']} {rec['kind']} {rec['nbytes']} B on {len(rec['group'])}"
        if rec["kind"] == "send_recv":  # a transfer group's parts (all-to-all, gather, a ring): one case
            name = f"{rec['name']} send_recv parts"
        group_env = dict(rec.get("nccl_env") or {})
        env = {**{k: v for k, v in run.env.items() if k.startswith(("NCCL_", "PHANTORA_NCCL"))}, **group_env}
        why = check_record(rec, sizes, hosts_of) or forced_ok(rec, env)
        ref = None if why else nt_reference(rec, run)
        if ref is not None and "protocol" in (rec.get("nccl") or {}):
            why = compare_choice(rec, nccl_tests_choice(rec["kind"], rec["nbytes"], ref[1], ref[0], env, work), ref)
        if not cases.get(name):
            cases[name] = why
    cases.update(same_all_to_all(cosim["collectives"]))
    return list(cases.items())


def same_all_to_all(records: list[dict]) -> dict[str, str]:
    """An all-to-all of equal parts given as lists (its transfers, one NCCL group) against all_to_all_single of the
    same bytes in the same run: NCCL runs both as one group of ncclSend / ncclRecv to every peer (ProcessGroupNCCL's
    alltoall and alltoall_base), so they take the same time, counted from the last start to the last end: the
    collective starts at its last member's issue, a group's pairs each once both their ends have issued (ranks that
    leave the call before at different times issue the lists apart)."""
    spans: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in records:
        spans[(rec["name"], rec["kind"])].append(rec)

    def span(recs: list[dict]) -> int:
        return max(r["end_ns"] for r in recs) - max(r["t_start"] for r in recs)

    single = {recs[0]["nbytes"]: (name, span(recs)) for (name, kind), recs in spans.items() if kind == "all_to_all"}
    out = {}
    for (name, kind), recs in spans.items():
        sizes = {r["nbytes"] for r in recs}
        n = len({r["group"][0] for r in recs})
        if kind != "send_recv" or not name.startswith("all_to_all") or len(sizes) != 1 or len(recs) != n * (n - 1):
            continue
        total = sizes.pop() * n
        if total in single:
            other, t = single[total]
            mine = span(recs)
            why = "" if mine == t else f"{mine} ns as lists, {t} ns as all_to_all_single ({other}), {total} B"
            out[f"{name} all_to_all lists = all_to_all_single"] = why
    return out


def compare_choice(rec: dict, nt: dict | str, ref: tuple[str, int]) -> str:
    if isinstance(nt, str):
        return nt
    mine = rec["nccl"]
    diff = [k for k in CHOICE_KEYS if k in nt and not same(nt[k], mine.get(k))]
    if not diff:
        return ""
    theirs = {k: nt[k] for k in diff}
    return f"choice { ({k: mine.get(k) for k in diff}) } != nccl-tests {theirs} ({ref[0]} --np {ref[1]})"


def same(theirs: object, mine: object) -> bool:
    return theirs == mine if isinstance(theirs, str) else float(str(theirs)) == float(str(mine))


def strip_host(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: strip_host(v) for k, v in doc.items() if k not in HOST_FIGURES and not k.endswith(("_mb", "_s"))}
    if isinstance(doc, list):
        return [strip_host(x) for x in doc]
    return doc


def fingerprint(out: Path) -> tuple[object, object, str]:
    res = strip_host(json.loads((out / "results.json").read_text()))
    cos = json.loads((out / "cosim.json").read_text())["collectives"]
    return res, cos, (out / "flows.csv").read_text()


def one_line_refusal(err: str, name: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("  ")]
    if "Traceback" in err:
        return "a traceback, not one line"
    if not any(name in ln for ln in lines):
        return f"no line names {name}: {lines[-1:]}"
    return ""


def do_run(run: Run, work: Path, timeout_s: float) -> list[tuple[str, str, str]]:
    out = work / re.sub(r"[^A-Za-z0-9_.=-]+", "_", run.name)
    rc, err, wall = launch(run, work, out, timeout_s)
    head = f"{run.name} ({wall:.0f} s)"
    if run.refuse:
        if rc == 0:
            return [(head, "refusal", f"ran (rc 0); NCCL fails with {run.refuse} set so")]
        return [(head, "refusal", one_line_refusal(err, run.refuse))]
    if rc != 0:
        last = [ln for ln in err.splitlines() if ln.strip()][-3:]
        return [(head, "run", f"rc {rc}: {' | '.join(last)[:300]}")]
    rows = [(head, case, why) for case, why in record_cases(run, out, work)]
    if run.twice:
        out2 = work / (out.name + "-again")
        rc2, err2, _ = launch(run, work, out2, timeout_s)
        if rc2 != 0:
            rows.append((head, "deterministic", f"second run rc {rc2}"))
        else:
            a, b = fingerprint(out), fingerprint(out2)
            what = [w for w, x, y in zip(("results.json", "cosim.json", "flows.csv"), a, b, strict=True) if x != y]
            rows.append((head, "deterministic", f"differs: {', '.join(what)}" if what else ""))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side")
    ap.add_argument("--only", default="", help="only runs whose name holds this text")
    ap.add_argument("--ns3", action="store_true", help="also a small subset through ns-3 (packet mode)")
    ap.add_argument("--timeout", type=float, default=240.0, help="wall seconds a run may take")
    ap.add_argument("--keep", default="", help="keep the run directories here")
    ap.add_argument("--reuse", action="store_true", help="check the runs that completed in --keep DIR again")
    args = ap.parse_args()
    REUSE[0] = args.reuse
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="live-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    todo = [r for r in runs(args.ns3) if args.only in r.name]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda r: do_run(r, work, args.timeout), todo))
    rows = [row for rs in results for row in rs]
    width = max(len(f"{a} {b}") for a, b, _ in rows)
    fails = 0
    for run_name, case, why in rows:
        fails += bool(why)
        print(f"{'FAIL' if why else 'pass'}  {f'{run_name} {case}':<{width}}  {why}")
    print(f"\n{len(todo)} runs, {len(rows)} cases, {fails} failed, {time.monotonic() - t0:.0f} s wall")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
