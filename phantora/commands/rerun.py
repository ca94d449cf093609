"""`phantora rerun DIR`: run again what produced the run directory DIR (its config.json), into a new one.

The same options, from the same working directory; the topology must still be the one the run used
(its digest is checked). At the end it says whether the simulated steps came out identical.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from phantora.commands.options import add_progress_options, progress_mode
from phantora.commands.outdir import add_out_options
from phantora.commands.run import step_printer
from phantora.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser("rerun", help="run again what produced a run directory (its config.json)", description=__doc__)
    p.add_argument("run", type=Path, help="a run directory written by `phantora run --out`")
    add_out_options(p, "the new run (default: RUN-rerun, RUN-rerun2, ...)")
    add_progress_options(p, quiet_also=" nor rank 0's output")
    p.set_defaults(func=run)


def _fresh(run: Path) -> Path:
    for i in range(1, 1000):
        cand = run.with_name(f"{run.name}-rerun{'' if i == 1 else i}")
        if not cand.exists():
            return cand
    raise InputError("no free name for the new run directory; pass --out", file=str(run))


def run(args: argparse.Namespace) -> int:
    from phantora.launcher import RunConfig, launch, resolve_topology
    from phantora.results.provenance import read_config, topology_digest
    from phantora.runtime.results import format_summary

    doc = read_config(args.run)
    if doc.get("kind", "run") != "run":
        command = " ".join(doc.get("command") or [])
        raise InputError(
            f"rerun repeats `phantora run` directories; this one was written by `phantora {doc['kind']}`: "
            f"run its command again with a new --out ({command})",
            file=str(args.run / "config.json"),
        )
    options: dict[str, Any] = dict(doc["options"])
    here = Path(doc.get("cwd") or os.getcwd())
    with contextlib.chdir(here):
        topo = resolve_topology(options["topology"])
        if topology_digest(topo) != doc["topology"]["sha256"]:
            raise InputError(
                f"topology {options['topology']!r} is not the one the run used (its nodes or links changed)",
                file=str(args.run / "config.json"),
            )
        options.update(topology=topo, out_dir=args.out or _fresh(args.run.resolve()), overwrite=args.overwrite)
        options["command"] = ["phantora", "rerun", str(args.run)]
        known = set(RunConfig.__dataclass_fields__)
        if progress_mode(args) != "off":
            options["on_step"] = step_printer(every_step=bool(args.progress) or sys.stdout.isatty())
        if "jobs" in options:  # a run of several jobs (phantora run/replay --jobs)
            return _rerun_jobs(args, options, RunConfig(script="", **{k: v for k, v in options.items() if k in known}))
        report = launch(RunConfig(**{k: v for k, v in options.items() if k in known}))
    if not args.quiet and report.logs.get("rank 0", "").strip():
        print("----- rank 0 output -----\n" + report.logs["rank 0"].rstrip() + "\n-------------------------")
    print(format_summary(report.summary))
    print(f"wrote {report.out_dir}")
    return _compare_steps(args.run, report.summary)


def _rerun_jobs(args: argparse.Namespace, options: dict[str, Any], cfg: Any) -> int:
    """The same jobs (as the run resolved them: paths, GPUs) again; reproduced if every job's times match."""
    from phantora.jobs.run import format_jobs, launch_jobs
    from phantora.jobs.spec import JobSpec, JobsSpec

    jobs = [JobSpec(**j) for j in options["jobs"]]
    spec = JobsSpec(jobs, bool(options.get("all_or_nothing")), options.get("jobs_file"))
    report = launch_jobs(spec, cfg, alone=bool(options.get("alone")), live_ok=True)
    print(format_jobs(report.summary))
    print(f"wrote {report.out_dir}")
    bad = 0
    for j in jobs:
        try:
            old = json.loads((args.run / "jobs" / j.name / "results.json").read_text())
        except (OSError, ValueError):
            print(f"{args.run} has no results of job {j.name}: nothing to compare with")
            continue
        a = [s["time_ns"] for s in old.get("steps", [])]
        b = [s["time_ns"] for s in report.jobs[j.name].get("steps", [])]
        print(f"job {j.name}: " + ("reproduced" if a == b else f"NOT reproduced ({a} vs {b})"))
        bad += a != b
    return 1 if bad else 0


def _compare_steps(old_dir: Path, new: dict[str, Any]) -> int:
    try:
        old = json.loads((old_dir / "results.json").read_text())
    except (OSError, ValueError):
        print(f"{old_dir} has no results.json (the run did not complete): nothing to compare with")
        return 0
    a = [s["time_ns"] for s in old.get("steps", [])]
    b = [s["time_ns"] for s in new.get("steps", [])]
    if a == b:
        print(f"reproduced: the {len(b)} simulated step times are identical to {old_dir}'s")
        return 0
    print(f"NOT reproduced: step times differ from {old_dir}'s ({a} vs {b})")
    return 1
