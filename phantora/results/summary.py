"""Run-level results of a live run: per-iteration simulated time, tokens/s per GPU, MFU, results.json.

A step ends when the slowest rank ends it: step i ends at max over ranks of that rank's i-th
`step()` time, and lasts from the end of step i-1 (or 0). The steady-state step time averages
every step but the first (which includes start-up: DDP's broadcast, first-touch allocations).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from phantora.perfmodel.gpus import GpuSpec
from phantora.results import schema
from phantora.results.write import write_json
from phantora.units import plural

# How the summary names a compute-model tier (results.json keeps the bare names, phantora.perfmodel.pubfit.TIERS):
# "l40s" is curves fitted on L40S measurements and scaled to the run's GPU, whatever that GPU is; "pcie" the copies
# between host and GPU that PHANTORA_HOST_COMPUTE=on times over the PCIe link (runtime/hostwork.py), no GPU model's.
TIER_LABELS = {"l40s": "L40S-shaped curves scaled to this GPU", "pcie": "host<->GPU copies over PCIe"}


def _workload(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    for r in sorted(ranks):
        wl = ranks[r].get("workload") or {}
        if wl:
            return dict(wl)
    return {}


def _dominant_dtype(ranks: dict[int, dict[str, Any]]) -> str:
    total: dict[str, int] = {}
    for res in ranks.values():
        for k, v in (res.get("flops_by_dtype") or {}).items():
            total[k] = total.get(k, 0) + int(v)
    return max(sorted(total), key=lambda k: total[k]) if total else "bf16"


def _memory(ranks: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Simulated device memory over ranks: the highest peak, each rank's peak, the worst rank's breakdown."""
    mems = {r: res["memory"] for r, res in ranks.items() if (res.get("memory") or {}).get("tracked")}
    if not mems:
        return None
    worst = max(sorted(mems), key=lambda r: int(mems[r]["peak_bytes"]))
    w = mems[worst]
    return {
        "peak_bytes": int(w["peak_bytes"]),
        "worst_rank": worst,
        "breakdown_at_peak": dict(w.get("peak_breakdown") or {}),
        "per_rank_peak_bytes": [int(mems[r]["peak_bytes"]) for r in sorted(mems)],
        "step_peak_bytes": list(w.get("step_peak_bytes") or []),
        "capacity_bytes": w.get("capacity_bytes"),
        "limit_bytes": w.get("limit_bytes"),
        # the caching allocator's segments (torch.cuda.max_memory_reserved), the worst rank's
        "reserved_peak_bytes": max(int(m.get("reserved_peak_bytes") or 0) for m in mems.values()),
        "step_reserved_peak_bytes": list(w.get("step_reserved_peak_bytes") or []),
        "allocator": dict(w.get("allocator") or {}),
    }


def _step_storage(ranks: dict[int, dict[str, Any]], n_steps: int) -> list[int] | None:
    """The longest checkpoint I/O of any rank in each step (ns), or None when no storage model charged any."""
    if not any(r.get("storage") for r in ranks.values()):
        return None
    out = [0] * n_steps
    for r in ranks.values():
        s = r.get("step_storage_ns") or []
        for i in range(min(n_steps, len(s))):
            out[i] = max(out[i], int(s[i]) - (int(s[i - 1]) if i else 0))
    return out


def _storage_totals(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Checkpoint bytes and time over the live ranks, by "read" / "write"; time: the longest rank's."""
    out: dict[str, dict[str, int]] = {}
    for r in ranks.values():
        for kind, v in (r.get("storage") or {}).items():
            e = out.setdefault(kind, {"bytes": 0, "max_rank_ns": 0})
            e["bytes"] += int(v["bytes"])
            e["max_rank_ns"] = max(e["max_rank_ns"], int(v["ns"]))
    return dict(sorted(out.items()))


def summarize(ranks: dict[int, dict[str, Any]], gpu: GpuSpec) -> dict[str, Any]:
    """Aggregate the results every rank passed to finish().

    With rank deduplication only the live ranks report; each stands for as many ranks, so rates
    per GPU divide by the job's world size and sums over ranks (counted FLOPs) by the live count.
    """
    live = len(ranks)
    world = max((int(r.get("world_size") or 0) for r in ranks.values()), default=0) or live
    n_steps = min((len(r.get("step_ends_ns", [])) for r in ranks.values()), default=0)
    ends = [max(int(r["step_ends_ns"][i]) for r in ranks.values()) for i in range(n_steps)]
    start = max((int(r.get("start_ns") or 0) for r in ranks.values()), default=0)  # a job that started later
    times = [e - (ends[i - 1] if i else start) for i, e in enumerate(ends)]
    busy = [0] * n_steps  # the busiest rank's compute time in each step
    for r in ranks.values():
        b = r.get("step_busy_ns") or []
        for i in range(min(n_steps, len(b))):
            busy[i] = max(busy[i], int(b[i]) - (int(b[i - 1]) if i else 0))
    steady = times[1:] if len(times) > 1 else times
    out: dict[str, Any] = {
        "schema": schema.RUN,
        "world_size": world,
        "live_processes": live,
        "gpu": gpu.display_name,
        "start_ns": start,
        "end_ns": max((int(r["end_ns"]) for r in ranks.values()), default=0),
        "steps": [
            {"index": i, "end_ns": e, "time_ns": t, "compute_ns": c, "exposed_ns": t - c}
            for i, (e, t, c) in enumerate(zip(ends, times, busy, strict=True))
        ],
    }
    io = _step_storage(ranks, n_steps)
    if io is not None:  # checkpoint reads and writes charged by a storage model (runtime/storage.py)
        for st, ns in zip(out["steps"], io, strict=True):
            st["storage_ns"] = ns
            st["exposed_ns"] = max(0, st["exposed_ns"] - ns)
        out["storage"] = _storage_totals(ranks)
    wl = _workload(ranks)
    dtype = str(wl.get("dtype") or _dominant_dtype(ranks))
    out["workload"] = wl
    if steady:
        mean_ns = statistics.fmean(steady)
        out["step_time_ns"] = {"mean": mean_ns, "min": min(steady), "max": max(steady), "steps_averaged": len(steady)}
        seconds = mean_ns / 1e9
        if wl.get("tokens_per_step") and seconds > 0:
            out["tokens_per_s_per_gpu"] = wl["tokens_per_step"] / seconds / world
        peak = gpu.peak(dtype)
        out["mfu_dtype"] = dtype
        if wl.get("flops_per_step") and seconds > 0:
            out["mfu"] = wl["flops_per_step"] / (seconds * world * peak)
        first = 1 if len(times) > 1 else 0
        counted = 0
        for r in ranks.values():
            fl = r.get("step_flops") or []
            if len(fl) >= n_steps and n_steps:
                counted += fl[n_steps - 1] - (fl[first - 1] if first else 0)
        if counted and seconds > 0:
            out["hfu"] = counted / len(steady) / (seconds * live * peak)
    out["peak_rss_mb_total"] = sum(float(r.get("peak_rss_mb") or 0) for r in ranks.values())
    out["pss_mb_total"] = sum(float(r.get("pss_mb") or 0) for r in ranks.values())  # at the end, shared pages split
    mem = _memory(ranks)
    if mem is not None:
        out["memory"] = mem
    routings = sorted({str(r["moe_routing"]) for r in ranks.values() if r.get("moe_routing")})
    if routings:  # phantom mode's routing of an MoE's top-k of phantom scores (runtime/simcuda/kept_values.py)
        out["moe_routing"] = ", ".join(routings)
    sites: dict[str, set[str]] = {}
    for r in ranks.values():
        for kind, found in (r.get("moe_routing_sites") or {}).items():
            sites.setdefault(kind, set()).update(found)
    if sites:  # every top-k site of phantom scores: the routers' (balanced), the others' (phantom), grouped ones
        out["moe_routing_sites"] = {kind: sorted(found) for kind, found in sorted(sites.items())}
    shapes = [r["phantom_shapes"] for r in ranks.values() if r.get("phantom_shapes")]
    if shapes:  # phantom mode's sizes of data-dependent ops (runtime/data_shapes.py: PHANTORA_PHANTOM_SHAPES)
        out["phantom_shapes"] = {
            "assumed": ", ".join(sorted({str(a["assumed"]) for a in shapes})),
            "sites": sorted({site for a in shapes for site in a["sites"]}),
        }
    simulated = sorted({p for r in ranks.values() for p in r.get("simulated_packages") or []})
    if simulated:  # stand-ins a rank imported where the package was not installed (runtime/simcuda/simapex.py)
        out["simulated_packages"] = simulated
        used = {
            p
            for r in ranks.values()
            for p in set(r.get("simulated_packages") or []) - set(r.get("simulated_packages_unused") or [])
        }
        if unused := set(simulated) - used:  # imported, called on no rank (runtime/simcuda/simflash.py)
            out["simulated_packages_unused"] = sorted(unused)
    untimed = _untimed(ranks)
    if untimed:
        out["untimed_kernels"] = untimed
    tiers = compute_tiers(ranks)
    if tiers:
        out["compute_tiers"] = tiers
    out["ranks"] = [
        {
            k: ranks[r].get(k)
            for k in (
                "rank",
                "end_ns",
                "compute_busy_ns",
                "comm_wait_ns",
                "nccl_host_launch",
                "ops",
                "flops_by_dtype",
                "comm",
                "peak_rss_mb",
                "pss_mb",
                "storage",
                "host_work",
            )
        }
        for r in sorted(ranks)
    ]
    return out


def compute_tiers(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Which tier timed what share of the live ranks' kernel time (launch overhead not counted): measured
    (a --perf-table entry), public (the public per-GPU fit), l40s (the L40S-shaped curves), curves (a
    --curves file), roofline (ops the calibrated model cannot describe, or --compute-model roofline),
    estimate (triton kernels). The shares add up to 1."""
    total: dict[str, int] = {}
    for res in ranks.values():
        for tier, ns in (res.get("kernel_ns_by_tier") or {}).items():
            total[tier] = total.get(tier, 0) + int(ns)
    all_ns = sum(total.values())
    if not all_ns:
        return {}
    names = sorted(total, key=lambda t: -total[t])
    return {"share": {t: total[t] / all_ns for t in names}, "kernel_ns": {t: total[t] for t in names}}


def _untimed(ranks: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Kernels the compute model could not time, over the live ranks: count and how they were charged."""
    out: dict[str, dict[str, Any]] = {}
    for r in ranks.values():
        for name, entry in (r.get("untimed_kernels") or {}).items():
            merged = out.setdefault(name, {"count": 0, "charged": entry["charged"], "ranks": 0})
            merged["count"] += entry["count"]
            merged["ranks"] += 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["count"]))


_SIMULATED = {  # what each simulated package (runtime/simcuda/simapex.py, simflash.py) runs as
    "apex": "apex's fused LayerNorm / RMSNorm run as torch norm kernels",
    "flash-attn": "FlashAttention 2 runs as the flash attention kernel",
    "flash-attn-3": "FlashAttention 3 runs as the flash attention kernel, its forward charged by FA3's published H100 "
    "figures (its backward by FA2's)",
}


def _routing_lines(summary: dict[str, Any]) -> list[str]:
    """Phantom mode's routing, once: the routers' top-k sites that took it, the top-k sites left phantom, and
    group-limited routing, modelled or not (runtime/simcuda/kept_values.py, grouped_routing.py)."""
    sites = summary.get("moe_routing_sites") or {}
    lines = []
    if summary.get("moe_routing"):
        at = ", ".join(sites.get("balanced", []))
        where = f" at the router top-k of {at}" if at else ""
        lines.append(f"phantom mode: MoE routing assumed {summary['moe_routing']}{where} (results.json moe_routing)")
    if sites.get("limited"):
        lines.append(
            f"phantom mode: group-limited routing ({', '.join(sites['grouped'])}): the final top-k "
            f"({', '.join(sites['limited'])}) picks each token's k experts within its chosen groups, balanced over "
            "each group's experts"
        )
    elif sites.get("grouped"):
        lines.append(
            f"phantom mode: group-limited routing ({', '.join(sites['grouped'])}) not modelled: no final top-k "
            "followed its group top-k over the same tokens, so routing is balanced over all experts"
        )
    shapes = summary.get("phantom_shapes")
    if shapes:
        more = f" and {len(shapes['sites']) - 4} more" if len(shapes["sites"]) > 4 else ""
        lines.append(
            f"phantom mode: data-dependent sizes assumed (PHANTORA_PHANTOM_SHAPES={shapes['assumed']}) at "
            f"{', '.join(shapes['sites'][:4])}{more} (results.json phantom_shapes)"
        )
    if sites.get("phantom"):
        lines.append(
            f"phantom mode: top-k of phantom scores left phantom (not an MoE router's): {', '.join(sites['phantom'])}"
        )
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable report."""
    live = summary.get("live_processes", summary["world_size"])
    procs = f" ({live} live processes stood for them)" if live != summary["world_size"] else ""
    lines = [
        f"{summary['world_size']} ranks on {summary['gpu']}{procs}; simulated end {summary['end_ns'] / 1e6:.3f} ms"
    ]
    for st in summary["steps"][:20]:
        lines.append(
            f"  step {st['index']:>3}: {st['time_ns'] / 1e6:10.3f} ms  compute {st['compute_ns'] / 1e6:.3f} ms"
            f"  not hidden {st['exposed_ns'] / 1e6:.3f} ms"
            + (f"  checkpoint I/O {st['storage_ns'] / 1e6:.3f} ms" if st.get("storage_ns") else "")
        )
    if len(summary["steps"]) > 20:
        lines.append(f"  ... {len(summary['steps']) - 20} more steps")
    if summary["steps"]:
        lines.append(
            "  (step 0 counts from the run's start, set-up included, so it is longer than the script's own timer"
            " says; the steady step time leaves it out)"
            if len(summary["steps"]) > 1
            else "  (step 0 counts from the run's start, set-up included: run 2 steps or more for a steady time)"
        )
    if "step_time_ns" in summary:
        s = summary["step_time_ns"]
        what = "steady, " if len(summary["steps"]) > 1 else "with set-up, "
        lines.append(f"step time ({what}{plural(s['steps_averaged'], 'step')}): mean {s['mean'] / 1e6:.3f} ms")
    if "tokens_per_s_per_gpu" in summary:
        lines.append(f"tokens/s per GPU: {summary['tokens_per_s_per_gpu']:.1f}")
    if "mfu" in summary:
        lines.append(f"MFU ({summary['mfu_dtype']} peak): {100 * summary['mfu']:.2f}%")
    if "hfu" in summary:
        lines.append(f"counted FLOPs utilisation ({summary['mfu_dtype']} peak): {100 * summary['hfu']:.2f}%")
    if "memory" in summary:
        m, gib = summary["memory"], 1 << 30
        parts = ", ".join(f"{k} {v / gib:.2f}" for k, v in m["breakdown_at_peak"].items())
        cap = f" of {m['capacity_bytes'] / gib:.2f} GiB" if m.get("capacity_bytes") else ""
        lines.append(f"device memory peak (simulated): {m['peak_bytes'] / gib:.2f} GiB{cap} on rank {m['worst_rank']}")
        if m.get("reserved_peak_bytes"):
            lines.append(f"  reserved by the caching allocator at most: {m['reserved_peak_bytes'] / gib:.2f} GiB")
        lines.append(f"  at the peak, GiB: {parts}")
    if summary.get("compute_tiers"):
        shares = ", ".join(
            f"{TIER_LABELS.get(t, t)} {100 * v:.1f}%" for t, v in summary["compute_tiers"]["share"].items()
        )
        lines.append(f"kernel time by compute-model tier: {shares}")
    lines += _host_lines(summary)
    if summary.get("untimed_kernels"):
        k = summary["untimed_kernels"]
        names = ", ".join(list(k)[:3]) + (", ..." if len(k) > 3 else "")
        lines.append(f"{len(k)} kinds of kernel not timed by the compute model ({names}): results.json untimed_kernels")
    if summary.get("simulated_packages"):
        unused = set(summary.get("simulated_packages_unused") or [])
        said = "; ".join(
            f"{p} imported, none of its functions called" if p in unused else _SIMULATED.get(p, p)
            for p in summary["simulated_packages"]
        )
        lines.append(
            f"simulated packages: {', '.join(summary['simulated_packages'])} (not installed here; results.json "
            f"simulated_packages): {said}"
        )
    lines += _routing_lines(summary)
    idle = (summary.get("network") or {}).get("idle_fabric")
    if idle:
        lines.append(f"note: {idle['text']}")
    lines += [f"warning: {w}" for w in (summary.get("network") or {}).get("warnings", [])]
    if summary.get("scenario"):
        from phantora.results.scenario import format_scenario

        lines.append(format_scenario(summary["scenario"]))
    return "\n".join(lines)


def _host_lines(summary: dict[str, Any]) -> list[str]:
    """The host work of the rank with the most (PHANTORA_HOST_COMPUTE=on; runtime/hostwork.py), if any."""
    ranks = [r for r in summary.get("ranks", []) if r.get("host_work")]
    if not ranks:
        return []
    r = max(ranks, key=lambda x: x["host_work"]["host_ns"])
    h = r["host_work"]
    pcie = ", ".join(
        f"{'to the GPU' if k == 'h2d' else 'to the host'} {v['bytes'] / 1e6:.1f} MB in {v['ns'] / 1e6:.3f} ms"
        for k, v in sorted(h["pcie"].items(), reverse=True)
    )
    return [
        f"host work on {h['host']} (rank {r['rank']}): {h['host_ns'] / 1e6:.3f} ms of host ops, the GPU waited"
        f" {h['idle_ns'] / 1e6:.3f} ms for them" + (f"; PCIe {pcie}" if pcie else "")
    ]


def write_results(path: str | Path, data: dict[str, Any]) -> Path:
    """results.json of a live run, keys in the order `summarize` gives them."""
    return write_json(Path(path), data, indent=1, sort_keys=False)
