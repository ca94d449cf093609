"""`phantora rerun DIR`: run again what produced the run directory DIR (its config.json), into a new one.

DIR may be written by `phantora run`, `replay` or `netsim` (one seed's directory of a `--seeds` group, or one
configuration of a sweep, too). The same options, from the same working directory, with the model switches the run
read from its environment (`model_env`: PHANTORA_HOST_COMPUTE, ..., set or unset as they were); every input the run
recorded (script, workload, graph directory, trace, flow file, HPCC config, jobs file) must still have the
content it had, and the topology the same nodes and links: a moved or changed one is refused, named. The
new directory's config.json says which run it repeats (`rerun_of`). At the end it says whether the
simulated results came out identical (exit 1 if not).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from phantora.commands.options import add_progress_options, progress_mode
from phantora.commands.outdir import add_out_options
from phantora.commands.run import step_printer
from phantora.errors import InputError
from phantora.results import schema as S
from phantora.results.read import read_results
from phantora.results.run_dir import RunDir

KINDS = ("run", "replay", "netsim")
# Each command's side outputs: files written outside the run directory, not written again.
SIDE_OUTPUTS = {"replay": ("save_graph", "export_chakra")}


def register(sub: Any) -> None:
    p = sub.add_parser("rerun", help="run again what produced a run directory (its config.json)", description=__doc__)
    p.add_argument("run", type=Path, help="a run directory written by `phantora run`, `replay` or `netsim` --out")
    add_out_options(p, "the new run (default: RUN-rerun, RUN-rerun2, ...)")
    add_progress_options(p, quiet_also=" nor rank 0's output")
    p.set_defaults(func=run)


def _fresh(run: Path) -> Path:
    for i in range(1, 1000):
        cand = run.with_name(f"{run.name}-rerun{'' if i == 1 else i}")
        if not cand.exists():
            return cand
    raise InputError("no free name for the new run directory; pass --out", file=str(run))


def _check_topology(spec: Any, recorded: dict[str, Any], where: str) -> Any:
    """The run's topology, loaded again; InputError if its nodes or links are not the ones the run used."""
    from phantora.launcher import resolve_topology
    from phantora.results.provenance import topology_digest

    topo = resolve_topology(spec)
    if topology_digest(topo) == recorded["sha256"]:
        return topo
    counts = (len(topo.nodes), len(topo.links))
    then = (recorded.get("nodes"), recorded.get("links"))
    if None not in then and counts != then:
        what = f"{counts[0]} nodes and {counts[1]} links now, the run had {then[0]} and {then[1]}"
    else:
        what = "its node names, link rates, latencies or GPU model differ"
    raise InputError(f"topology {spec!r} changed since the run: {what}", file=where)


def _refuse_seed_group(run: Path) -> None:
    """A `--seeds N` directory holds one run per seed, each with its config.json: name them."""
    if RunDir(run).exists(S.CONFIG_JSON) or not RunDir(run).exists(S.SEEDS_JSON):
        return
    runs = sorted(p.name for p in run.glob("seed*") if RunDir(p).exists(S.CONFIG_JSON))
    raise InputError(
        f"a seed group (--seeds): rerun one seed's run, e.g. phantora rerun {run / (runs[0] if runs else 'seed1')} "
        f"(runs here: {', '.join(runs) or 'none'})",
        file=str(run),
    )


def _check_packet(recorded: dict[str, Any] | None, config: Any, topo: Any, where: str) -> None:
    """The packet settings the recorded options give now must be the ones the run used (a default may have
    changed since): InputError naming the first that differs."""
    from phantora.results.provenance import packet_settings
    from phantora.results.reproduce import first_difference

    now = None if config is None else json.loads(json.dumps(packet_settings(config, topo), default=str))
    if isinstance(recorded, dict):  # runs before issue 35 also recorded the defaults as Python resolved them
        recorded = {k: v for k, v in recorded.items() if k != "resolved"}
    diff = first_difference(recorded, now)
    if diff is not None:
        raise InputError(
            f"this phantora resolves the run's options to other packet settings (packet.{diff}, the run's first): "
            "rerun it with the phantora that made it",
            file=where,
        )


LEGACY_ENGINE_OPTIONS = ("network", "cc", "packet_set", "queue_sample_ns", "seed", "window_ns", "scenario")


def recorded_engine(options: dict[str, Any]) -> Any:
    """The `EngineSpec` a `phantora run` directory's options record (`engine`, its plain data); a run from before
    issue 35 recorded the engine's flags flat (`LEGACY_ENGINE_OPTIONS`, taken out of `options`), built as then."""
    from phantora.netsim.cli_config import engine_spec_from_flags
    from phantora.netsim.engine_spec import EngineSpec

    old = {k: options.pop(k) for k in LEGACY_ENGINE_OPTIONS if k in options}
    if "engine" in options:
        return EngineSpec.from_dict(options["engine"])
    flags: dict[str, Any] = {"cc": old.get("cc"), "sets": old.get("packet_set") or (), "seed": old.get("seed")}
    flags["queue_sample_ns"] = old.get("queue_sample_ns")
    network = old.get("network") or "flow"
    return engine_spec_from_flags(network, window_ns=old.get("window_ns"), scenario=old.get("scenario"), **flags)


def _version_note(then: dict[str, Any] | None, options: dict[str, Any]) -> None:
    """Say which recorded versions differ now; the modelled torch is the one the rerun's ranks get (this shell's
    environment under the run's recorded `env`)."""
    from phantora.results.provenance import versions

    now = versions({**os.environ, **(options.get("env") or {})})
    changed = [
        f"{k} {then.get(k)} -> {now[k]}"
        for k in ("phantora", "ns3", "torch", "torch_modelled")
        if then and k in then and then.get(k) != now[k]
    ]
    if changed:
        print(f"note: the versions differ from the run's ({', '.join(changed)}): results may differ")


def run(args: argparse.Namespace) -> int:
    from phantora.results.inputs import check_all
    from phantora.results.provenance import read_config, rerun_origin

    args.run = args.run.absolute()  # the run is repeated from its own working directory
    _refuse_seed_group(args.run)
    doc = read_config(args.run)
    kind = doc.get("kind", "run")
    where = str(RunDir(args.run).config)
    if kind not in KINDS:
        raise InputError(f"written by `phantora {kind}`, which rerun does not know", file=where, field="kind")
    if "inputs" not in doc:
        print("note: this run recorded no input digests (an older phantora): its input files are not checked")
    check_all(doc.get("inputs") or {}, where)  # the options name them as the run did, from the same directory
    _version_note(doc.get("versions"), doc.get("options") or {})
    options: dict[str, Any] = dict(doc["options"])
    for name in SIDE_OUTPUTS.get(kind, ()):
        if options.get(name):
            print(f"note: --{name.replace('_', '-')} {options[name]} is not written again")
            options[name] = None
    out = (args.out or _fresh(args.run)).absolute()
    origin = rerun_origin(args.run, doc)
    command = getattr(args, "command_line", None) or ["phantora", "rerun", str(args.run)]
    here = Path(doc.get("cwd") or os.getcwd())
    if not here.is_dir():
        raise InputError(f"the run's working directory {here} is gone (its relative paths start there)", file=where)
    with contextlib.chdir(here), _model_env(doc, where):
        topo = _check_topology(options["topology"], doc["topology"], where)
        if kind == "run":
            try:
                options["engine"] = recorded_engine(options)
            except InputError as exc:
                raise InputError(exc.message, file=where, field=f"options.{exc.field or 'engine'}") from None
            _check_packet(doc.get("packet"), options["engine"].packet_used, topo, where)
            options.update(topology=topo, out_dir=out, overwrite=args.overwrite, command=command, rerun_of=origin)
            return _rerun_live(args, options)
        rc = _rerun_command(kind, doc, options, args, topo, out, command, origin)
    if rc != 0:
        return rc
    return _compare_dirs(args.run, out)


def _model_env(doc: dict[str, Any], where: str) -> contextlib.AbstractContextManager[None]:
    """The run's model switches in this process's environment (the ranks inherit it), as config.json records them."""
    from phantora.results import model_env

    if "model_env" not in doc:
        print("note: this run recorded no model switches (an older phantora): this shell's PHANTORA_* apply")
        return contextlib.nullcontext()
    return model_env.restored(model_env.check(doc["model_env"], where))


def _rerun_command(kind: str, doc: dict[str, Any], options: dict[str, Any], args: argparse.Namespace, topo: Any,
                   out: Path, command: list[str], origin: dict[str, Any]) -> int:  # fmt: skip
    """`phantora replay` or `netsim` with the recorded options (the current parser's defaults for any the
    run did not record), into `out`."""
    recorded_packet = doc.get("packet")
    module = importlib.import_module(f"phantora.commands.{kind}")
    parser = argparse.ArgumentParser(prog=f"phantora {kind}")
    module.register(parser.add_subparsers(dest="command"))
    required = ["--topology", str(options["topology"])] + (
        ["--flows", str(options["flows"])] if kind == "netsim" else []
    )
    ns = parser.parse_args([kind, *required])
    for key, value in options.items():
        if key not in vars(ns):
            raise InputError(
                f"the run used option {key!r}, which this phantora's `{kind}` does not have",
                file=str(RunDir(args.run).config),
                field=f"options.{key}",
            )
        setattr(ns, key, value)
    ns.set = list(ns.set or [])
    _check_packet(recorded_packet, module.engine_spec(ns).packet_used, topo, str(RunDir(args.run).config))
    ns.seeds = None  # a seed group's runs are rerun one by one (each seed<S>/ has its own config.json)
    ns.out, ns.overwrite, ns.progress, ns.quiet = out, args.overwrite, args.progress, args.quiet
    ns.command_line, ns.rerun_of = command, origin
    return int(ns.func(ns) or 0)


def _compare_dirs(old: Path, new: Path) -> int:
    from phantora.results.reproduce import compare

    if not any(RunDir(old).exists(n) for n in (S.RESULTS_JSON, S.SUMMARY_JSON)):
        print(f"{old} has no results (the run did not complete): nothing to compare with")
        return 0
    same, diffs = compare(old, new)
    if diffs:
        print(f"NOT reproduced: {len(diffs)} difference(s) from {old}'s results")
        for line in diffs:
            print(f"  {line}")
        return 1
    print(f"reproduced: {', '.join(same)} identical to {old}'s")
    return 0


def _rerun_live(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """A `phantora run` directory: the script (or the jobs) again through the launcher."""
    from phantora.launcher import RunConfig, launch
    from phantora.results.summary import format_summary

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
    from phantora.launcher import jobs_algo

    jobs = [JobSpec(**j) for j in options["jobs"]]
    spec = JobsSpec(jobs, bool(options.get("all_or_nothing")), options.get("jobs_file"))
    report = launch_jobs(spec, cfg, alone=bool(options.get("alone")), live_ok=True, algo=jobs_algo(cfg))
    print(format_jobs(report.summary))
    print(f"wrote {report.out_dir}")
    bad = 0
    for j in jobs:
        old = read_results(RunDir(args.run).job(j.name).root)
        if old is None:
            print(f"{args.run} has no results of job {j.name}: nothing to compare with")
            continue
        a = [s["time_ns"] for s in old.get("steps", [])]
        b = [s["time_ns"] for s in report.jobs[j.name].get("steps", [])]
        print(f"job {j.name}: " + ("reproduced" if a == b else f"NOT reproduced ({a} vs {b})"))
        bad += a != b
    return 1 if bad else 0


def _compare_steps(old_dir: Path, new: dict[str, Any]) -> int:
    old = read_results(old_dir)
    if old is None:
        print(f"{old_dir} has no results.json (the run did not complete): nothing to compare with")
        return 0
    a = [s["time_ns"] for s in old.get("steps", [])]
    b = [s["time_ns"] for s in new.get("steps", [])]
    if a == b:
        print(f"reproduced: the {len(b)} simulated step times are identical to {old_dir}'s")
        return 0
    print(f"NOT reproduced: step times differ from {old_dir}'s ({a} vs {b})")
    return 1
