"""`phantora sweep`: run a grid of configurations, each as its own process, and gather one tidy table.

A grid (TOML, or flags) has a command template, fixed parameters and swept parameters::

    name = "cc-incast"
    command = ["replay", "{workload}", "--no-progress", "--out", "{out}"]   # optional; this is the default
    jobs = 2                      # parallel runs (default: the number of cores)
    timeout = 900                 # seconds per run (default: none)

    [fixed]
    workload = "workloads/incast_heavy.toml"
    topology = "star8"
    network = "ns3"
    "set.buffer_bytes" = 1000000

    [grid]                        # the cartesian product of these lists, in this order
    cc = ["none", "dcqcn", "hpcc", "dctcp"]

Each run is `python -m phantora.cli <command>` with `{name}` replaced by the run's parameter, `{out}` by
its run directory and `{index}` by its number. Parameters the template does not name become flags:
`set.FIELD = v` gives `--set FIELD=v` (booleans as 1/0), `name = true/false` gives `--name`/`--no-name`,
anything else `--name v` (underscores become dashes). They go at the end, or where the template has a
`{flags}` token; `phantora run` needs that, since what follows its script belongs to the script:
`command = ["run", "{flags}", "--out", "{out}", "{script}", "--steps", "3"]` with `window = ["1us", "10us"]`.

A recorded execution graph (`phantora run --record DIR`) can be the workload of every run: `trace = "DIR"` in
the grid file (a list sweeps several) or `--trace DIR`; the runs are then replays of it (`use_traces`).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantora.errors import InputError, PhantoraError
from phantora.files import read_toml
from phantora.progress import Progress, auto_mode
from phantora.results import schema as S
from phantora.results.read import RunData, read_document
from phantora.results.run_dir import RunDir, read_status
from phantora.results.write import write_json
from phantora.sweep_local import RunOutcome, RunSpec, Scalar, prebuild_ns3, run_local

DEFAULT_COMMAND = ("replay", "{workload}", "--no-progress", "--out", "{out}")
RESERVED = ("out", "index", "flags")
FLAGS = "{flags}"  # a template token where the flags of the unnamed parameters go (default: the end)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
_PLACEHOLDER = re.compile(r"\{([A-Za-z][A-Za-z0-9_.\-]*)\}")
_RUN_ELAPSED = re.compile(r"^(.*), (\d+(?::\d\d){1,2}) elapsed$")


@dataclass
class SweepSpec:
    """A sweep: the command template, the fixed parameters and the swept lists (in grid order)."""

    name: str = "sweep"
    command: tuple[str, ...] = DEFAULT_COMMAND
    fixed: dict[str, Scalar] = field(default_factory=dict)
    grid: dict[str, list[Scalar]] = field(default_factory=dict)
    jobs: int | None = None
    timeout_s: float | None = None
    source: str | None = None  # the grid file, for error messages

    def validate(self) -> SweepSpec:
        """Raise InputError naming the file and field of the first bad entry."""
        if not self.command:
            raise InputError("the command template is empty", file=self.source, field="command")
        for section, names in (("fixed", self.fixed), ("grid", self.grid)):
            for name in names:
                if not _NAME.fullmatch(name) or name in RESERVED:
                    raise InputError(f"bad parameter name {name!r}", file=self.source, field=f"{section}.{name}")
        both = set(self.fixed) & set(self.grid)
        if both:
            raise InputError("set both as fixed and swept", file=self.source, field=sorted(both)[0])
        for name, values in self.grid.items():
            if not isinstance(values, list) or not values:
                raise InputError("expected a non-empty list of values", file=self.source, field=f"grid.{name}")
            for v in values:
                _check_scalar(v, f"grid.{name}", self.source)
        for name, v in self.fixed.items():
            _check_scalar(v, f"fixed.{name}", self.source)
        known = set(self.fixed) | set(self.grid) | set(RESERVED)
        for token in self.command:
            for ph in _PLACEHOLDER.findall(token):
                if ph not in known:
                    raise InputError(f"placeholder {{{ph}}} names no parameter", file=self.source, field="command")
        if "{out}" not in " ".join(self.command):
            raise InputError("the command template must contain {out}", file=self.source, field="command")
        if self.jobs is not None and (not isinstance(self.jobs, int) or self.jobs < 1):
            raise InputError(f"jobs must be an integer >= 1, got {self.jobs!r}", file=self.source, field="jobs")
        if self.timeout_s is not None and (not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0):
            raise InputError(f"timeout must be seconds > 0, got {self.timeout_s!r}", file=self.source, field="timeout")
        return self

    @property
    def params(self) -> list[str]:
        """Every parameter name: fixed ones, then swept ones."""
        return [*self.fixed, *self.grid]

    def points(self) -> list[dict[str, Scalar]]:
        """The configurations of the grid, the last swept parameter varying fastest."""
        keys = list(self.grid)
        return [
            dict(self.fixed, **dict(zip(keys, combo, strict=True))) for combo in itertools.product(*self.grid.values())
        ]


def _check_scalar(v: Any, where: str, source: str | None) -> None:
    if not isinstance(v, (str, int, float, bool)):
        raise InputError(f"expected a string, number or boolean, got {v!r}", file=source, field=where)


def load_grid(path: str | Path) -> SweepSpec:
    """Read a grid TOML file (see the module docstring)."""
    p = Path(path)
    data = read_toml(p, "grid file")
    unknown = set(data) - {"name", "description", "command", "jobs", "timeout", "trace", "fixed", "grid"}
    if unknown:
        known = "name, description, command, jobs, timeout, trace, fixed, grid"
        raise InputError(f"unknown key (known: {known})", file=str(p), field=sorted(unknown)[0])
    command = data.get("command", DEFAULT_COMMAND)
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if not isinstance(command, (list, tuple)) or not all(isinstance(t, str) for t in command):
        raise InputError("expected a list of strings (or one string)", file=str(p), field="command")
    for key in ("fixed", "grid"):
        if not isinstance(data.get(key, {}), dict):
            raise InputError("expected a table", file=str(p), field=key)
    spec = SweepSpec(
        name=str(data.get("name", p.stem)),
        command=tuple(command),
        fixed=dict(data.get("fixed", {})),
        grid={k: v if isinstance(v, list) else [v] for k, v in data.get("grid", {}).items()},
        jobs=data.get("jobs"),
        timeout_s=data.get("timeout"),
        source=str(p),
    )
    if "trace" in data:
        traces = data["trace"] if isinstance(data["trace"], list) else [data["trace"]]
        if not traces or not all(isinstance(t, str) for t in traces):
            raise InputError("expected a graph directory or a list of them", file=str(p), field="trace")
        use_traces(spec, traces, field="trace")
    return spec.validate()


def use_traces(spec: SweepSpec, traces: Sequence[str], field: str = "--trace") -> SweepSpec:
    """Make recorded execution graphs the workload of every run: one trace is fixed, several are swept.

    Each must be a graph directory that loads (checked here once, rather than failing every run); the
    command template must be a `replay` that names `{workload}` (the default one does).
    """
    from phantora.egraph.format import is_graph_dir, load

    if "workload" in spec.fixed or "workload" in spec.grid:
        raise InputError("give either a trace or a workload, not both", file=spec.source, field=field)
    if not spec.command or spec.command[0] != "replay" or not any("{workload}" in t for t in spec.command):
        raise InputError(
            "a trace is replayed: the command template must be `replay {workload} ...` (the default is)",
            file=spec.source,
            field=field,
        )
    for t in traces:
        if not is_graph_dir(t):
            raise InputError(
                "not a recorded execution graph (no graph.json; record one with phantora run --record DIR)",
                file=t,
                field=field,
            )
        load(t)  # a corrupt or truncated trace: one clear error naming the file
    if len(traces) == 1:
        spec.fixed = {"workload": traces[0], **spec.fixed}
    else:
        spec.grid = {"workload": list(traces), **spec.grid}
    return spec


def parse_param(text: str) -> tuple[str, list[Scalar]]:
    """'cc=none,dcqcn' -> ('cc', ['none', 'dcqcn']) for --param; true/false become booleans, digits integers."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not name or not values.strip():
        raise InputError(f"expected NAME=V1,V2,..., got {text!r}", field="--param")
    return name, [_cli_value(v.strip()) for v in values.split(",")]


def _cli_value(text: str) -> Scalar:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


# ----- commands ---------------------------------------------------------------------------------------


def _text(v: Scalar) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def command_args(spec: SweepSpec, params: dict[str, Scalar], out: Path, index: int) -> list[str]:
    """The arguments after `python -m phantora.cli` for one run."""
    values = {k: _text(v) for k, v in params.items()} | {"out": str(out), "index": str(index)}
    used: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        used.add(m.group(1))
        return values[m.group(1)]

    tokens = [t if t == FLAGS else _PLACEHOLDER.sub(sub, t) for t in spec.command]
    flags: list[str] = []
    for name in spec.params:
        if name in used:
            continue
        v = params[name]
        if name.startswith("set."):
            flags += ["--set", f"{name[4:]}={_text(v)}"]
        elif isinstance(v, bool):
            flags.append(f"--{'' if v else 'no-'}{name.replace('_', '-')}")
        else:
            flags += [f"--{name.replace('_', '-')}", str(v)]
    if FLAGS not in tokens:
        return tokens + flags
    at = tokens.index(FLAGS)
    return tokens[:at] + flags + [t for t in tokens[at + 1 :] if t != FLAGS]


def _slug(index: int, varying: dict[str, Scalar]) -> str:
    text = "_".join(f"{k.removeprefix('set.')}={v}" for k, v in varying.items())
    text = re.sub(r"[^A-Za-z0-9_.=+\-]+", "-", text)[:80].strip("-")
    return f"{index:03d}" + (f"-{text}" if text else "")


def build_runs(spec: SweepSpec, out_dir: Path) -> list[RunSpec]:
    """One RunSpec per grid point, with its run directory out_dir/runs/NNN-<swept values>."""
    runs = []
    for i, params in enumerate(spec.points()):
        varying = {k: params[k] for k in spec.grid}
        out = (out_dir / "runs" / _slug(i, varying)).absolute()
        runs.append(RunSpec(i, params, command_args(spec, params, out, i), out, varying))
    return runs


# ----- the table --------------------------------------------------------------------------------------


def table_rows(
    spec: SweepSpec, runs: Sequence[RunSpec], outcomes: Sequence[RunOutcome], keep: list[RunData] | None = None
) -> list[dict[str, Any]]:
    """One row per run: run number, status, error, wall time, directory, every parameter, every metric, and
    `warnings`: how many warnings the run's engine gave (engine.json's, e.g. a switch without a shared buffer; a
    count, so `df[df.warnings > 0]` finds them and a groupby sums them; their text is in each run's engine.json and
    under the printed table). `keep` gets each run read here, its flows only (what the plots draw), so no run
    directory is read twice (a packet run's queues.csv can hold a million rows)."""
    from phantora.report.compare import SUMMARY, engine_warnings, summarise
    from phantora.results.read import load_run

    rows = []
    for run, res in zip(runs, outcomes, strict=True):
        row: dict[str, Any] = {
            "run": run.index,
            "status": res.status,
            "returncode": res.returncode,
            "error": res.error,
            "wall_s": round(res.wall_s, 3),
            "dir": str(run.out),
        }
        row.update({k: run.params[k] for k in spec.params})
        metrics: dict[str, Any] = dict.fromkeys(SUMMARY)
        metrics["time_kind"] = None
        metrics["warnings"] = None
        if res.status == "ok":
            try:
                data = load_run(run.out, run.label)
            except PhantoraError as exc:
                row.update(status="failed", error=f"unreadable results: {exc}")
            else:
                metrics.update(summarise(data))
                metrics["time_kind"] = data.time_kind if data.time_ns is not None else None
                metrics["warnings"] = len(engine_warnings(data))
                if keep is not None:
                    keep.append(RunData(path=data.path, label=data.label, flows=data.flows))
        row.update({f"m.{k}" if k in spec.params else k: v for k, v in metrics.items()})
        rows.append(row)
    return rows


def write_table(
    rows: Sequence[dict[str, Any]], out_dir: Path, name: str = "sweep.csv", parquet: bool = True
) -> list[Path]:
    """sweep.csv (always) and sweep.parquet (when pyarrow is installed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = list(rows[0]) if rows else ["run", "status"]
    path = out_dir / name
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in rows:
            w.writerow({k: "" if row.get(k) is None else row[k] for k in cols})
    paths = [path]
    if not parquet:
        return paths
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return paths
    columns: dict[str, list[Any]] = {}
    for c in cols:
        values = [row.get(c) for row in rows]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            values = [None if v is None else str(v) for v in values]  # mixed types: a text column
        elif kinds == {int, float}:
            values = [None if v is None else float(v) for v in values]
        columns[c] = values
    pq.write_table(pa.table(columns), out_dir / "sweep.parquet")
    return [*paths, out_dir / "sweep.parquet"]


SEEDS_CSV = "sweep_seeds.csv"


def seed_rows(spec: SweepSpec, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """With `seed` swept: one row per configuration, each metric's mean and spread over its seeds (else [])."""
    from phantora.report.compare import SUMMARY
    from phantora.report.spread import seed_groups

    if len(spec.grid.get("seed", [])) < 2:
        return []
    return seed_groups(rows, spec.params, list(SUMMARY))


def sweep_plots(
    spec: SweepSpec,
    rows: Sequence[dict[str, Any]],
    runs: Sequence[RunSpec],
    out_dir: Path,
    loaded: Sequence[RunData] | None = None,
) -> list[Path]:
    """Time (and PFC paused time) against the CC algorithm, or the first swept parameter; FCT CDF of the runs
    (`loaded`: the runs as `table_rows` kept them; read again where not given). Where a run has both flows on
    NVLink alone and flows through the network, the FCT p99 of the latter against the parameter and their CDF.
    With seeds swept, a bar is the mean over the seeds and its error bar their range (min to max)."""
    from phantora.report.plots import fct_cdf, metric_vs_param
    from phantora.results.read import load_run

    varying = [k for k in spec.grid if len(spec.grid[k]) > 1 and k != "seed"]
    grouped = seed_rows(spec, rows)
    paths: list[Path] = []
    if varying:
        param = "cc" if "cc" in varying else varying[0]
        series = [k for k in varying if k != param]
        ok = grouped or [r for r in rows if r["status"] == "ok"]
        kinds = {r["time_kind"] for r in ok if r.get("time_kind")}
        what = "iteration time" if kinds == {"iteration"} else "makespan" if kinds == {"makespan"} else "time"
        short = param.removeprefix("set.")
        paths += metric_vs_param(
            ok, param, "time_ns", out_dir / f"time_vs_{short}", ylabel=f"{what} (ms)", series=series, scale=1e6
        )
        paths += metric_vs_param(
            ok,
            param,
            "pfc_paused_ns",
            out_dir / f"pfc_paused_vs_{short}",
            ylabel="PFC paused time, all ports (µs)",
            series=series,
            scale=1e3,
            empty="no PFC pauses in any run",
        )
        if mixed_rows(rows):
            paths += metric_vs_param(
                ok,
                param,
                "net_fct_p99_ns",
                out_dir / f"net_fct_p99_vs_{short}",
                ylabel="FCT p99, network flows (µs)",
                series=series,
                scale=1e3,
            )
    if loaded is None:
        read = []
        for run, row in zip(runs, rows, strict=True):
            if row["status"] == "ok":
                try:
                    read.append(load_run(run.out, run.label))
                except PhantoraError:
                    continue
        loaded = read
    paths += fct_cdf(loaded, out_dir / "fct_cdf")
    if mixed_rows(rows):
        paths += fct_cdf(loaded, out_dir / "fct_cdf_network", network=True)
    return paths


# ----- the whole sweep --------------------------------------------------------------------------------


SWEEP_JSON = "sweep.json"
SWEEP = "phantora.sweep/1"


def run_note(index: int, text: str) -> str:
    """The sweep line's word on its running run: the run's progress line, its own elapsed time named as the run's
    (`run 0 (1:53 in): network: ...`), for the sweep's line ends with the sweep's elapsed time."""
    m = _RUN_ELAPSED.match(text)
    return f"run {index} ({m.group(2)} in): {m.group(1)}" if m else f"run {index}: {text}"


def identity(spec: SweepSpec) -> dict[str, Any]:
    """What makes two sweeps the same sweep (as JSON would give it back)."""
    doc = {"name": spec.name, "command": list(spec.command), "fixed": spec.fixed, "grid": spec.grid}
    return dict(json.loads(json.dumps(doc)))


def record_outcome(run: RunSpec, res: RunOutcome) -> None:
    """<run dir>/sweep-run.json: the run's command and outcome, which a resumed sweep trusts."""
    doc = {"args": run.args, "status": res.status, "returncode": res.returncode, "error": res.error}
    RunDir(run.out).write_json(S.SWEEP_RUN_JSON, {**doc, "wall_s": res.wall_s}, sort_keys=False)


def _completed(run: RunSpec) -> RunOutcome | None:
    rec = read_document(run.out, S.SWEEP_RUN_JSON)
    if rec is None:
        return None
    if rec.get("args") != run.args or rec.get("status") != "ok":
        return None
    status = read_status(run.out)  # the run's own status.json, when its command writes one
    if status is not None and status.get("state") != "complete":
        return None
    return RunOutcome(run.index, "ok", rec.get("returncode"), "", float(rec.get("wall_s") or 0.0))


def plan_resume(spec: SweepSpec, out_dir: Path, runs: Sequence[RunSpec], resume: bool | None) -> dict[int, RunOutcome]:
    """The runs an earlier sweep in `out_dir` completed, by index (none when starting over)."""
    try:
        meta = json.loads((out_dir / SWEEP_JSON).read_text())
    except (OSError, ValueError):
        meta = None
    if meta is None or resume is False:
        if resume is False:
            shutil.rmtree(out_dir / "runs", ignore_errors=True)
        return {}
    mine = identity(spec)
    if any(meta.get(k) != v for k, v in mine.items()):
        raise InputError(
            f"{out_dir} holds another sweep ({meta.get('name')!r}, a different command or grid): choose "
            "another --out, or pass --no-resume to replace it",
            file=str(out_dir / SWEEP_JSON),
        )
    return {r.index: o for r in runs if (o := _completed(r)) is not None}


@dataclass
class SweepResult:
    """The runs, their outcomes, the table rows and the files written."""

    runs: list[RunSpec]
    outcomes: list[RunOutcome]
    rows: list[dict[str, Any]]
    files: list[Path]

    @property
    def failed(self) -> list[tuple[RunSpec, RunOutcome]]:
        return [(r, o) for r, o in zip(self.runs, self.outcomes, strict=True) if self.rows[r.index]["status"] != "ok"]


def run_sweep(
    spec: SweepSpec,
    out_dir: Path,
    *,
    jobs: int | None = None,
    ray_address: str | None = None,
    progress: str | bool | None = None,
    plots: bool = True,
    report: Callable[[str], None] | None = None,
    resume: bool | None = None,
) -> SweepResult:
    """Run every point of `spec` (locally or on Ray), then write sweep.csv/.parquet, sweep.json and plots.

    `resume` (None: when `out_dir` holds the same sweep) keeps the runs an earlier sweep there completed
    and runs only the others (failed, interrupted or never started); False starts over. `progress`: a mode
    of `phantora.progress` ("off", "bar", "lines"), or a flag (None: a bar on a terminal, else lines).
    """
    spec.validate()
    out_dir = Path(out_dir)
    runs = build_runs(spec, out_dir)
    n_jobs = jobs or spec.jobs or os.cpu_count() or 1
    say = report or (lambda msg: print(msg, file=sys.stderr))
    mode = progress if isinstance(progress, str) else auto_mode(progress)
    kept = plan_resume(spec, out_dir, runs, resume)
    if kept:
        say(f"sweep {spec.name}: resuming in {out_dir}: {len(kept)} of {len(runs)} runs are complete, "
            f"running the other {len(runs) - len(kept)}")  # fmt: skip
    todo = [r for r in runs if r.index not in kept]
    write_json(out_dir / SWEEP_JSON, {"schema": SWEEP, "state": "running", **identity(spec)}, sort_keys=False)
    bar = Progress(mode, f"sweep {spec.name}", len(todo), "run")

    def done(run: RunSpec, res: RunOutcome) -> None:
        record_outcome(run, res)
        if (bar.note or "").startswith((f"run {run.index}: ", f"run {run.index} (")):
            bar.note = None
        failed = res.status != "ok"
        bar.update(add=1, failed=int(failed))
        if failed:
            bar.write(f"run {run.index} failed ({run.describe()}): {res.error}")

    def warned(run: RunSpec, text: str) -> None:  # as the run prints it (its engine's, when built)
        bar.write(f"run {run.index} ({run.describe()}): warning: {text}")

    def running(run: RunSpec, text: str) -> None:  # a run's own progress line: its steps, the network's clock
        bar.show(run_note(run.index, text))

    try:
        if ray_address is not None:
            from phantora.sweep_ray import run_on_ray

            fresh = run_on_ray(todo, ray_address, spec.timeout_s, on_done=done)
        else:
            prebuild_ns3(todo, say)
            fresh = run_local(todo, n_jobs, spec.timeout_s, on_done=done, on_warning=warned, on_progress=running)
    finally:
        bar.close()
    by_index = {**kept, **{o.index: o for o in fresh}}
    outcomes = [by_index[r.index] for r in runs]
    kept_runs: list[RunData] = []  # each run as table_rows read it, for the plots
    rows = table_rows(spec, runs, outcomes, kept_runs)
    files = write_table(rows, out_dir)
    grouped = seed_rows(spec, rows)
    if grouped:
        files += write_table(grouped, out_dir, SEEDS_CSV, parquet=False)
    meta = {
        "schema": SWEEP,
        "state": "complete",
        **identity(spec),
        "backend": "ray" if ray_address is not None else "local",
        "jobs": None if ray_address is not None else n_jobs,
        "resumed": sorted(kept),  # runs kept from an earlier, interrupted sweep
        "rows": rows,
        "seed_groups": grouped,  # with seeds swept: each configuration's mean and spread over its seeds
    }
    write_json(out_dir / SWEEP_JSON, meta, sort_keys=False)
    files.append(out_dir / SWEEP_JSON)
    if plots:
        files += sweep_plots(spec, rows, runs, out_dir, kept_runs)
    result = SweepResult(runs, outcomes, rows, files)
    for run, _ in result.failed:
        row = rows[run.index]
        say(f"FAILED run {run.index} ({run.describe()}): {row['error']}  [log: {RunDir(run.out).file(S.RUN_LOG)}]")
    return result


def format_rows(spec: SweepSpec, rows: Sequence[dict[str, Any]]) -> str:
    """A short table of the sweep: swept parameters and the main metrics, one line per run (and how many warnings
    its engine gave, when any run's did), and under it each warning, with the runs that gave it."""
    from phantora.report.compare import fmt_spread, fmt_value, shown

    params = list(spec.grid) or ["run"]
    cols = [
        ("time_ns", "time µs", "ns"),
        ("fct_p99_ns", "fct p99 µs", "ns"),
        ("slowdown_p99", "slow p99", "ratio"),
        ("net_fct_p50_ns", "net p50 µs", "ns"),
        ("net_fct_p99_ns", "net p99 µs", "ns"),
        ("net_slowdown_p99", "net slow p99", "ratio"),
        ("pfc_paused_ns", "paused µs", "ns"),
        ("queue_max_bytes", "qmax KB", "bytes"),
        ("ecn_marks", "ecn", "count"),
    ]
    keep = shown([c[0] for c in cols], mixed_rows(rows))  # the network-flow columns where a run has both kinds
    cols = [c for c in cols if c[0] in keep]
    warned = any(r.get("warnings") for r in rows)  # (a column of zeros would only widen the table)
    head = ["run", "status", *[p.removeprefix("set.") for p in params], *[c[1] for c in cols]]
    head += ["warnings"] if warned else []
    body = []
    for r in rows:
        body.append(
            [str(r["run"]), r["status"], *[str(r.get(p)) for p in params]]
            + [fmt_value(r.get(k), u) if r["status"] == "ok" else "-" for k, _, u in cols]
            + ([str(r["warnings"]) if r.get("warnings") is not None else "-"] if warned else [])
        )
    lines = _aligned(head, body) + warning_lines(rows)
    grouped = seed_rows(spec, rows)
    if grouped:
        keys = [p for p in params if p != "seed"]
        head = [*[p.removeprefix("set.") for p in keys], "seeds", "failed", *[c[1] for c in cols]]
        body = []
        for g in grouped:
            cells = [fmt_value(g[k], u) + fmt_spread(_spread_of(g, k), u) for k, _, u in cols]
            body.append([*[str(g.get(p)) for p in keys], g["seeds"], str(g["failed"]), *cells])
        lines += [
            "",
            "over the seeds: mean ±standard deviation (min and max in sweep_seeds.csv)",
            *_aligned(head, body),
        ]
    return "\n".join(lines)


def mixed_rows(rows: Sequence[dict[str, Any]]) -> bool:
    """Has a run of the sweep that ended ok both flows on NVLink alone and flows through the network?"""
    from phantora.report.compare import both_kinds

    return any(both_kinds(r) for r in rows if r.get("status") == "ok")


def warning_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """'warning (runs 0, 2): TEXT' for each distinct warning of the rows' runs (their engine.json), in run order."""
    from phantora.report.compare import warnings_in

    runs: dict[str, list[str]] = {}
    for r in rows:
        if r.get("warnings"):
            for w in warnings_in(Path(r["dir"])):
                runs.setdefault(w, []).append(str(r["run"]))
    return [f"warning (run{'s' if len(n) > 1 else ''} {', '.join(n)}): {w}" for w, n in runs.items()]


def _spread_of(row: dict[str, Any], key: str) -> dict[str, float] | None:
    return None if row.get(f"{key}_std") is None else {"std": row[f"{key}_std"]}


def _aligned(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    return lines
