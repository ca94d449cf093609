"""The job spec file of a multi-job run (`phantora run --jobs jobs.toml`, `phantora replay --jobs jobs.toml`).

    all_or_nothing = false     # optional: true = one job's failure ends every job
    [[job]]
    name = "a"                 # optional, default job<i>; unique
    script = "gpt_ddp.py"      # a live training script (path, or a shipped example) ...
    # workload = "ddp_buckets.toml"   ... or a workload file replayed by rank processes ...
    # graph = "rec/"                  ... or an execution graph recorded with phantora run --record
    args = ["--steps", "3"]    # the script's arguments (a list, or one string split like a shell)
    ranks = 8                  # the job's world size (nproc is a synonym); a graph's default is its own
    placement = "packed"       # packed | spread | random, or GPUs: [0, 1, "gpu9"] or "0-7,16-23"
    seed = 1                   # random placement's seed (default 0)
    start = "2ms"              # simulated time at which the job starts (default 0)
    steps = 3                  # stop the job after this many training steps (workloads: repeat it)
    traffic_class = 3          # the network class of its flows (1..7; packet mode queues each apart)
    env = { KEY = "value" }    # extra environment of its ranks

Relative paths are looked up beside the spec file first. Every error names the spec file, the line of the
job's ``[[job]]`` header and the field, and is raised before anything starts.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.resources import examples_dir, shipped_file
from phantora.topology.model import Topology
from phantora.topology.placement import POLICIES, choose, g_name, parse_gpus
from phantora.units import parse_time_ns

KINDS = ("script", "workload", "graph")
_JOB_KEYS = {
    "name",
    "script",
    "workload",
    "graph",
    "args",
    "ranks",
    "nproc",
    "placement",
    "seed",
    "start",
    "steps",
    "traffic_class",
    "env",
}
_TOP_KEYS = {"all_or_nothing", "job"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class JobSpec:
    """One job of a multi-job run, as the spec file gives it (paths resolved)."""

    name: str
    kind: str  # script | workload | graph
    source: str  # the script, workload file or graph directory (resolved where the spec file says)
    args: list[str] = field(default_factory=list)
    ranks: int | None = None  # None: a graph's own world size
    placement: str | list[int | str] = "packed"
    seed: int = 0
    start_ns: int = 0
    steps: int | None = None
    traffic_class: int | None = None  # None: the engines' default class
    env: dict[str, str] = field(default_factory=dict)
    line: int | None = None  # the line of its [[job]] header


@dataclass
class JobsSpec:
    """Every job of a run and the run-level choices."""

    jobs: list[JobSpec]
    all_or_nothing: bool = False
    source: str | None = None  # the spec file

    def where(self, job: JobSpec) -> dict[str, Any]:
        """InputError location keywords of `job` (file and line)."""
        return {"file": self.source, "line": job.line}


def _job_lines(text: str) -> list[int]:
    """The line of each [[job]] header, in order."""
    return [i for i, ln in enumerate(text.splitlines(), 1) if re.match(r"^\s*\[\[\s*job\s*\]\]", ln)]


def _resolve(value: str, base: Path) -> str:
    """A path relative to the spec file's directory if it exists there, else as given (a shipped name)."""
    p = Path(value).expanduser()
    if not p.is_absolute() and (base / p).exists():
        return str((base / p).resolve())
    return str(p)


def _int(raw: dict[str, Any], key: str, err: Any, lo: int, hi: int | None = None) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise err(f"must be an integer {span}, got {v!r}", key)
    return v


def _one_job(raw: Any, i: int, line: int | None, source: str, base: Path) -> JobSpec:
    named = raw.get("name") if isinstance(raw, dict) else None
    who = f"job {named!r}" if isinstance(named, str) and _NAME.match(named) else f"job #{i}"  # as later errors say

    def err(msg: str, key: str) -> InputError:
        return InputError(f"{who}: {msg}", file=source, line=line, field=key)

    if not isinstance(raw, dict):
        raise InputError(f"job #{i} must be a table ([[job]])", file=source, line=line)
    unknown = sorted(set(raw) - _JOB_KEYS)
    if unknown:
        raise err(f"unknown key (known: {', '.join(sorted(_JOB_KEYS))})", unknown[0])
    name = raw.get("name", f"job{i}")
    if not isinstance(name, str) or not _NAME.match(name):
        raise err(f"a name is letters, digits, '_', '.' or '-', got {name!r}", "name")
    kinds = [k for k in KINDS if k in raw]
    if len(kinds) != 1:
        got = ", ".join(kinds) or "none"
        raise err(f"give exactly one of {', '.join(KINDS)} (got {got})", kinds[-1] if kinds else "script")
    kind = kinds[0]
    if not isinstance(raw[kind], str) or not raw[kind]:
        raise err("must be a path", kind)
    args = raw.get("args", [])
    if isinstance(args, str):
        args = shlex.split(args)
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        raise err("must be a list of strings or one string", "args")
    if args and kind != "script":
        raise err(f"only a script takes arguments, this job is a {kind}", "args")
    if "ranks" in raw and "nproc" in raw:
        raise err("give ranks or nproc, not both", "nproc")
    rkey = "nproc" if "nproc" in raw else "ranks"
    ranks = _int(raw, rkey, err, 1)
    if ranks is None and kind != "graph":
        raise err(f"a {kind} job needs its number of ranks", "ranks")
    placement = raw.get("placement", "packed")
    if not isinstance(placement, (str, list)) or (isinstance(placement, str) and not placement.strip()):
        raise err(f"must be {', '.join(POLICIES)} or a list of GPUs, got {placement!r}", "placement")
    start = raw.get("start", 0)
    try:
        start_ns = parse_time_ns(start)
    except InputError as exc:
        raise err(exc.message, "start") from None
    if start_ns < 0:
        raise err(f"must be >= 0, got {start!r}", "start")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float)) for v in env.values()):
        raise err("must be a table of strings", "env")
    return JobSpec(
        name=name,
        kind=kind,
        source=_resolve(raw[kind], base),
        args=[str(a) for a in args],
        ranks=ranks,
        placement=placement if isinstance(placement, list) else placement.strip(),
        seed=_int(raw, "seed", err, 0) or 0,
        start_ns=start_ns,
        steps=_int(raw, "steps", err, 1),
        traffic_class=_int(raw, "traffic_class", err, 1, 7),
        env={str(k): str(v) for k, v in env.items()},
        line=line,
    )


def parse_jobs(text: str, source: str, base: Path | None = None) -> JobsSpec:
    """A spec file's text -> JobsSpec; InputError naming `source`, the line and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise InputError(f"not valid TOML: {exc}", file=source, line=int(m.group(1)) if m else None) from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise InputError(f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})", file=source, field=unknown[0])
    raw_jobs = data.get("job")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise InputError("no jobs: add one [[job]] table per job", file=source, field="job")
    aon = data.get("all_or_nothing", False)
    if not isinstance(aon, bool):
        raise InputError(f"must be true or false, got {aon!r}", file=source, field="all_or_nothing")
    lines = _job_lines(text)
    base = base if base is not None else Path(source).resolve().parent
    jobs = [_one_job(r, i, lines[i] if i < len(lines) else None, source, base) for i, r in enumerate(raw_jobs)]
    seen: dict[str, JobSpec] = {}
    for j in jobs:
        if j.name in seen:
            raise InputError(f"job name {j.name!r} is used twice", file=source, line=j.line, field="name")
        seen[j.name] = j
    return JobsSpec(jobs, aon, source)


def load_jobs(path: str | Path) -> JobsSpec:
    """Read a job spec file: a path, or the name of a shipped one (examples/jobs/, e.g. fsdp_pair)."""
    p = shipped_file(path, examples_dir() / "jobs", (".toml",))
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read the job spec: {exc.strerror or exc}", file=str(p)) from None
    return parse_jobs(text, str(p), p.resolve().parent)


def place_jobs(spec: JobsSpec, topo: Topology) -> list[list[int]]:
    """Each job's GPUs (natural ranks of `topo`, rank r of the job on the r-th): explicit lists first, then the
    policies in job order on the GPUs left. Overlaps and jobs that do not fit are InputErrors naming the job."""
    n_gpus = topo.num_ranks
    if any(j.ranks is None for j in spec.jobs):
        raise ValueError("place_jobs needs every job's rank count (a graph job's comes from its graph)")
    sizes = [j.ranks or 0 for j in spec.jobs]
    total = sum(sizes)
    if total > n_gpus:
        parts = ", ".join(f"{j.name} {n}" for j, n in zip(spec.jobs, sizes, strict=True))
        raise InputError(
            f"the jobs need {total} GPUs ({parts}) but '{topo.name}' has {n_gpus}", file=spec.source, field="ranks"
        )
    out: list[list[int] | None] = [None] * len(spec.jobs)
    owner: dict[int, str] = {}
    for i, j in enumerate(spec.jobs):
        if isinstance(j.placement, str) and j.placement in POLICIES:
            continue
        where = f"job '{j.name}'"
        try:
            gpus = parse_gpus(topo, j.placement, where)
        except InputError as exc:
            raise InputError(exc.message, **spec.where(j), field="placement") from None
        if len(gpus) != sizes[i]:
            msg = f"{where}: {len(gpus)} GPUs listed for {sizes[i]} ranks"
            raise InputError(msg, **spec.where(j), field="placement")
        for g in gpus:
            if g in owner:
                raise InputError(
                    f"{where}: GPU {g_name(topo, g)} is already job '{owner[g]}'s", **spec.where(j), field="placement"
                )
            owner[g] = j.name
        out[i] = gpus
    for i, j in enumerate(spec.jobs):
        if out[i] is not None:
            continue
        free = [g for g in range(n_gpus) if g not in owner]
        try:
            gpus = choose(topo, sizes[i], str(j.placement), free, j.seed)
        except ValueError as exc:
            raise InputError(f"job '{j.name}': {exc} on '{topo.name}'", **spec.where(j), field="placement") from None
        for g in gpus:
            owner[g] = j.name
        out[i] = gpus
    return [g for g in out if g is not None]
