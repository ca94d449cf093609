"""Read a run directory (run, replay or netsim; or a seed group) into one `RunData`, whatever files it has.

Every file is optional: a missing file means "not measured" (None here, "-" in reports), never an error.
A file that exists but cannot be parsed raises `InputError` naming the file and line. docs/results.md
lists the files and columns and shows the use of `load_run` from Python.

- results.json  schema "phantora.replay/1" (makespan, ops, engine stats), "phantora.egraph-replay/1" (a replayed
                execution graph: step times, comm per kind), "phantora.run/1" (a live run: steps, step_time_ns)
                or "phantora.jobs/1" (several jobs: the makespan and engine stats; each job's own is jobs/<name>/)
                or "phantora.nccl-tests/1" (`phantora nccl-tests`: each size's mean call time, their sum as time)
- cosim.json    "phantora.cosim/1", the bridge's summary of a live run (fallback when results.json is absent)
- summary.json  "phantora.netsim/1", `phantora netsim` engine counters
- config.json, status.json, steps.jsonl   what produced the run, whether it completed, its finished steps
- seeds.json    "phantora.seeds/1": a seed group, one run directory per seed (`--seeds N`)
The JSON documents are told apart by their "schema" id (`phantora.results.schema`); documents without one
(written before the ids existed) are recognised by their keys.
- flows.csv (or an older netsim's fct.csv)   one row per flow: FCT and standalone (ideal) FCT
- links.csv     one row per directed channel: utilisation (+ paused_ns, ecn_marks, max_queue_bytes in ns-3 runs)
- pfc.csv       PFC frames: time_ns, node, node_id, port, prio, pause (1 pause, 0 resume), from_node
- queues.csv    sampled egress queues: time_ns, node, node_id, port, peer, prio, bytes
  (files written before nodes had names hold the id in `node`; both are read)
- trace.json or trace/rank*.jsonl   Chrome trace with steps, compute and comm per rank
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from phantora.collectives.flow_tags import record_kind
from phantora.errors import InputError
from phantora.results import schema as S

MAX_NAMED_OPS = 40  # more distinct collective names than this: report the mean per kind


@dataclass
class Flows:
    """Per-flow arrays (integer ns and bytes), in file order."""

    size: np.ndarray
    start_ns: np.ndarray
    fct_ns: np.ndarray
    standalone_ns: np.ndarray  # 0 where unknown
    priority: np.ndarray  # traffic class, -1 where unknown
    cap_bps: (
        np.ndarray
    )  # the flow's rate cap its standalone FCT took (0: none), -1 where unknown (files before 2026-12-02)
    nvlink: np.ndarray  # 1: on its hosts' NVSwitch alone, 0: through the NICs, -1 where unknown (before 2026-12-06)


@dataclass
class LinkRow:
    """One directed channel of links.csv."""

    name: str  # "from->to"
    utilisation: float
    bytes: int
    paused_ns: int | None = None
    ecn_marks: int | None = None
    max_queue_bytes: int | None = None


@dataclass
class Span:
    """One interval of a rank's timeline (ns)."""

    rank: int
    lane: str  # "compute" | "comm" | "step"
    name: str
    start_ns: int
    end_ns: int


@dataclass
class RunData:
    """Everything a report needs from one run directory; None means "not measured"."""

    path: Path
    label: str
    kind: str = "unknown"  # replay | run | netsim | jobs | nccl-tests | unknown
    network: str | None = None
    time_ns: int | None = None  # iteration time (live runs) or makespan (replay, netsim)
    time_kind: str = "makespan"  # "iteration" | "makespan"
    sim_end_ns: int | None = None  # end of simulated time
    collectives: dict[str, int] | None = None  # op name -> duration ns
    engine: dict[str, Any] | None = None
    flows: Flows | None = None
    links: list[LinkRow] | None = None
    pfc: np.ndarray | None = None  # rows (time_ns, node id, port, prio, pause)
    queues: np.ndarray | None = None  # rows (time_ns, node id, port, prio, bytes)
    spans: list[Span] | None = None
    files: list[str] = field(default_factory=list)  # which known files were present
    config: dict[str, Any] | None = None  # config.json: options, packet settings with defaults, topology
    status: str | None = None  # status.json's state: complete, failed or running (None: no status.json)
    status_reason: str | None = None  # why a failed run failed
    steps: int | None = None  # steps in steps.jsonl (finished by every live rank)
    step_times_ns: list[int] | None = None  # their times, in order (None without steps.jsonl)
    cc: str | None = None  # the congestion control of a packet-level run
    members: list[RunData] | None = None  # a seed group: one run per seed (seeds.json)
    node_names: dict[int, str] = field(default_factory=dict)  # node id -> name, from pfc.csv and queues.csv
    port_peers: dict[tuple[int, int], str] = field(default_factory=dict)  # (node id, port) -> the node beyond it

    @property
    def partial(self) -> bool:
        """The run did not complete (it failed, or was stopped while running): what it has is what it kept."""
        return self.status in ("failed", "running") or any(m.partial for m in self.members or [])

    def port_label(self, key: tuple[int, int]) -> str:
        """A (node id, port) as "leaf0->spine1" (the egress from leaf0 towards spine1), as links.csv names
        links; "leaf0 port 3" where the peer is not known; "node 7 port 3" for files without names."""
        node = self.node_names.get(key[0], f"node {key[0]}")
        peer = self.port_peers.get(key)
        if not peer:
            return f"{node} port {key[1]}"
        twins = sum(1 for k, v in self.port_peers.items() if k[0] == key[0] and v == peer)
        return f"{node}->{peer}" + (f" (port {key[1]})" if twins > 1 else "")

    @property
    def end_ns(self) -> int | None:
        """The end of simulated time, for closing open PFC pauses."""
        if self.sim_end_ns is not None:
            return self.sim_end_ns
        if self.spans:
            return max(s.end_ns for s in self.spans)
        return self.time_ns if self.time_kind == "makespan" else None


def read_results(path: str | Path) -> dict[str, Any] | None:
    """The run directory's results.json as written (None if it has none, or it is not a JSON object): what
    rerun and compare check a run's own figures against."""
    return read_document(path, S.RESULTS_JSON)


def read_document(path: str | Path, name: str) -> dict[str, Any] | None:
    """One JSON document of the run directory `path` by its schema name (results.json, engine.json, trace.json,
    sweep-run.json, ...): None if it has none, or it is not a JSON object."""
    try:
        doc = json.loads((Path(path) / name).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    """steps.jsonl of the run directory `path`: one record per finished step (empty without the file); InputError
    naming a line that is not a JSON object."""
    p = Path(path) / S.STEPS_JSONL
    if not p.is_file():
        return []
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise InputError("bad step line (expected a JSON object)", file=str(p), line=i)
        out.append(rec)
    return out


def load_run(path: str | Path, label: str | None = None) -> RunData:
    """Read the run directory `path` (or a seed group, see `load_group`); InputError if it is not a directory.

    A run that did not complete (status.json failed or running) is read as far as it got: its files, and its
    iteration time from steps.jsonl when results.json is missing; `partial` says so."""
    root = Path(path)
    if not root.is_dir():
        raise InputError("not a run directory", file=str(root))
    if (root / S.SEEDS_JSON).is_file():
        return load_group(root, label)
    run = RunData(path=root, label=label or root.name)
    _load_results(run, root)
    _load_progress(run, root)
    run.config = _read_json(run, root / S.CONFIG_JSON)
    if run.network is None:
        options = _dict(_dict(run.config).get("options"))
        run.network = _text_or_none(options.get("network") or _dict(options.get("engine")).get("network"))
    run.cc = _cc(run)
    run.flows = _load_flows(run, root)
    run.links = _load_links(run, root)
    run.pfc = _load_ports(run, root / S.PFC_CSV, ("time_ns", "node", "port", "prio", "pause"), "from_node")
    run.queues = _load_ports(run, root / S.QUEUES_CSV, ("time_ns", "node", "port", "prio", "bytes"), "peer")
    run.spans = _load_trace(run, root)
    return run


def add_fabric_ports(run: RunData, fabric: str | Path) -> None:
    """Fill a job's run with its fabric's PFC frames and queue samples (pfc.csv, queues.csv of the directory
    that ran the fabric), where the job's own directory has none: a job of `phantora run --jobs` keeps only its
    flows, links and trace, so its fabric-wide figures come from the run that holds the fabric."""
    root = Path(fabric)
    if run.pfc is None:
        run.pfc = _load_ports(run, root / S.PFC_CSV, ("time_ns", "node", "port", "prio", "pause"), "from_node")
    if run.queues is None:
        run.queues = _load_ports(run, root / S.QUEUES_CSV, ("time_ns", "node", "port", "prio", "bytes"), "peer")


def load_group(root: Path, label: str | None = None) -> RunData:
    """A seed group (`--seeds N`): seeds.json names one run directory per seed. The group's RunData has them
    as `members`; its own figures are the first seed's, its flows those of every seed (for CDFs)."""
    doc = _read_json(RunData(root, ""), root / S.SEEDS_JSON) or {}
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) and "dir" in r for r in runs):
        raise InputError("expected runs: a list of {seed, dir}", file=str(root / S.SEEDS_JSON), field="runs")
    members = [load_run(root / str(r["dir"]), f"seed {r.get('seed')}") for r in runs]
    first = members[0]
    group = RunData(**{**first.__dict__, "path": root, "label": label or root.name, "files": [S.SEEDS_JSON]})
    group.members = members
    group.status = _text_or_none(doc.get("state"))  # running or failed: the group is partial
    flows = [m.flows for m in members if m.flows is not None]
    if flows:
        group.flows = Flows(*(np.concatenate([getattr(f, k) for f in flows]) for k in Flows.__dataclass_fields__))
    return group


def _load_progress(run: RunData, root: Path) -> None:
    """status.json and steps.jsonl: how far the run got; a partial live run's iteration time from its steps."""
    status = _read_json(run, root / S.STATUS_JSON)
    if status is not None:
        run.status = _text_or_none(status.get("state"))
        run.status_reason = _text_or_none(status.get("reason"))
    p = root / S.STEPS_JSONL
    if not p.is_file():
        return
    times = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        try:
            times.append(int(json.loads(line)["time_ns"]))
        except (ValueError, KeyError, TypeError):
            raise InputError("bad step line (expected JSON with time_ns)", file=str(p), line=i) from None
    run.files.append(p.name)
    run.steps, run.step_times_ns = len(times), times
    if run.time_ns is None and times:
        run.kind = "run" if run.kind == "unknown" else run.kind
        run.time_kind = "iteration"
        run.time_ns = _steady_mean(times)


def _cc(run: RunData) -> str | None:
    """The CC of a packet-level run: config.json's packet settings, else what results.json or summary.json say."""
    if run.network == "flow":
        return None
    packet = _dict(_dict(run.config).get("packet"))
    cc = _dict(packet.get("fields")).get("cc")
    if isinstance(cc, str):
        return cc
    engine = run.engine or {}
    return _text_or_none(engine.get("cc"))


# ----- JSON summaries ---------------------------------------------------------------------------------


def _read_json(run: RunData, p: Path) -> dict[str, Any] | None:
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", file=str(p)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", file=str(p), line=exc.lineno) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", file=str(p))
    run.files.append(p.name)
    return data


def _load_results(run: RunData, root: Path) -> None:
    res = _read_json(run, root / S.RESULTS_JSON)
    cosim = _read_json(run, root / S.COSIM_JSON)
    summary = _read_json(run, root / S.SUMMARY_JSON)
    if res is not None:
        schema = str(res.get("schema", ""))
        if _is(schema, S.REPLAY) or (not schema and "makespan_ns" in res and "ops" in res):
            run.kind = "replay"
            run.network = _text_or_none(res.get("network"))
            run.engine = res.get("engine") if isinstance(res.get("engine"), dict) else None
            run.time_ns = _int_or_none(res.get("makespan_ns"))
            run.sim_end_ns = run.time_ns
            run.collectives = _ops(res.get("ops"))
            return
        if _is(schema, S.EGRAPH_REPLAY) or (not schema and "step_times_ns" in res and "rank_step_ends_ns" in res):
            _graph_replay(run, res)
            return
        if _is(schema, S.JOBS):  # several jobs: the fabric's figures, timed by the makespan (each job: jobs/<name>)
            run.kind = "jobs"
            run.network = _text_or_none(_dict(res.get("run")).get("network"))
            run.engine = res.get("engine_stats") if isinstance(res.get("engine_stats"), dict) else None
            run.time_ns = run.sim_end_ns = _int_or_none(res.get("makespan_ns"))
            return
        if _is(schema, S.NCCL_TESTS):  # `phantora nccl-tests`: the mean time of one call per size
            run.kind = "nccl-tests"
            run.network = _text_or_none(res.get("network"))
            run.engine = res.get("engine") if isinstance(res.get("engine"), dict) else None
            sizes = [s for s in res.get("sizes") or [] if isinstance(s, dict) and "bytes" in s and "time_ns" in s]
            run.collectives = nccl_tests_rows(sizes) or None
            run.time_ns = sum(run.collectives.values()) if run.collectives else None  # one call of each size
            return
        if _is(schema, S.RUN) or (not schema and ("steps" in res or "step_time_ns" in res)):
            run.kind = "run"
            _live(run, res, cosim)
            return
        raise InputError(
            f"unknown schema {schema!r} (expected {S.REPLAY}, {S.EGRAPH_REPLAY} or {S.RUN})",
            file=str(root / S.RESULTS_JSON),
            field="schema",
        )
    if cosim is not None:
        run.kind = "run"
        _live(run, cosim, cosim)
        return
    if summary is not None:
        run.kind = "netsim"
        run.network = _text_or_none(summary.get("engine"))
        run.engine = summary
        run.time_ns = _int_or_none(summary.get("sim_end_ns"))
        run.sim_end_ns = run.time_ns


NCCL_BLOCK_FIELDS = ("datatype", "redop", "root")  # what tells an nccl-tests table's blocks apart (-d, -o, -r)


def nccl_tests_rows(sizes: list[dict[str, Any]]) -> dict[str, int]:
    """An nccl-tests results.json's size lines -> one row per size of each block, its mean call time in ns.

    Several blocks (`-d all`, `-o all`, `-r -1`, `-N`) each keep their rows: a block starts where the datatype,
    redop or root changes or the sizes start over; with one block a row is "<bytes> B", else it is prefixed by
    the fields that differ between blocks ("float sum 1048576 B"), or by "block k" where none does (-N cycles)."""
    blocks: list[list[dict[str, Any]]] = []
    for rec in sizes:
        last = blocks[-1][-1] if blocks else None
        if last is None or rec["bytes"] <= last["bytes"] or any(last.get(f) != rec.get(f) for f in NCCL_BLOCK_FIELDS):
            blocks.append([])
        blocks[-1].append(rec)
    differ = [f for f in NCCL_BLOCK_FIELDS if len({str(b[0].get(f)) for b in blocks}) > 1]
    labels = [" ".join(_block_field(f, b[0].get(f)) for f in differ) for b in blocks]
    if len(set(labels)) < len(labels):  # blocks alike in every field (-N cycles): numbered
        labels = [f"block {k} {lab}".strip() for k, lab in enumerate(labels, 1)]
    rows: dict[str, int] = {}
    for label, block in zip(labels, blocks, strict=True):
        for rec in block:
            rows[f"{label} {rec['bytes']} B".lstrip()] = round(rec["time_ns"])
    return rows


def _block_field(field: str, value: Any) -> str:
    return f"root={value}" if field == "root" else str(value)


def _is(schema: str, known: str) -> bool:
    """Same document kind (any version: a reader keeps reading older versions)."""
    return schema.partition("/")[0] == known.partition("/")[0]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _graph_replay(run: RunData, res: dict[str, Any]) -> None:
    """A replayed execution graph: the steady-state step time as for a live run (the makespan if the graph
    has no step marks), its network and engine counters, and the mean time per call of each collective kind."""
    info = _dict(res.get("run"))
    run.kind = "replay"
    run.network = _text_or_none(info.get("network"))
    stats = res.get("engine_stats")
    run.engine = stats if isinstance(stats, dict) else None
    run.sim_end_ns = _int_or_none(res.get("makespan_ns"))
    steps = res.get("step_times_ns")
    if isinstance(steps, list) and steps and all(_int_or_none(t) is not None for t in steps):
        run.time_kind = "iteration"
        run.time_ns = _steady_mean([int(t) for t in steps])
    else:
        run.time_ns = run.sim_end_ns
    run.collectives = _comm_per_call([{"comm": res.get("comm")}])


def _live(run: RunData, res: dict[str, Any], cosim: dict[str, Any] | None) -> None:
    """A live run: its steady-state iteration time, network, engine counters and collective times."""
    net = res.get("network")
    info = _dict(res.get("run"))
    run.network = _text_or_none(net) or _text_or_none(info.get("network"))
    netd = net if isinstance(net, dict) else {}
    stats = res.get("engine") or netd.get("engine_stats") or res.get("engine_stats")
    run.engine = stats if isinstance(stats, dict) else None
    run.sim_end_ns = _int_or_none(res.get("end_ns")) or _int_or_none(netd.get("makespan_ns"))
    run.sim_end_ns = run.sim_end_ns or _int_or_none(res.get("makespan_ns"))
    run.time_kind = "iteration"
    run.time_ns = _iteration_ns(res)
    if run.time_ns is None:
        run.time_kind = "makespan"
        run.time_ns = run.sim_end_ns
    run.collectives = (
        _ops(res.get("collectives"))
        or (_ops(cosim.get("collectives")) if cosim else None)
        or _comm_per_call(res.get("ranks"))
    )


def _steady_mean(times: list[int]) -> int:
    """The mean step time without the first step (start-up), as phantora run reports it."""
    steady = times[1:] if len(times) > 1 else times
    return round(fmean(steady))


def _iteration_ns(res: dict[str, Any]) -> int | None:
    """step_time_ns.mean, else the steady mean of steps[].time_ns, iteration_ns[] or the ranks' step ends."""
    st = res.get("step_time_ns")
    if isinstance(st, dict) and isinstance(st.get("mean"), (int, float)):
        return round(st["mean"])
    if isinstance(st, (int, float)) and not isinstance(st, bool):
        return round(st)
    steps = res.get("steps")
    if isinstance(steps, list) and steps and all(isinstance(x, dict) and "time_ns" in x for x in steps):
        return _steady_mean([int(x["time_ns"]) for x in steps])
    iters = res.get("iteration_ns")
    if isinstance(iters, list) and iters:
        return _steady_mean([int(x) for x in iters])
    from_ranks = _steps_from_ranks(res.get("ranks"))
    return _steady_mean(from_ranks) if from_ranks else None


def _rank_dicts(ranks: Any) -> list[dict[str, Any]]:
    if isinstance(ranks, dict):
        ranks = list(ranks.values())
    return [r for r in ranks if isinstance(r, dict)] if isinstance(ranks, list) else []


def _steps_from_ranks(ranks: Any) -> list[int]:
    """Per-step durations, the slowest rank of each step, from each rank's step_ends_ns."""
    ends: list[list[Any]] = [e for r in _rank_dicts(ranks) if isinstance(e := r.get("step_ends_ns"), list) and e]
    if not ends:
        return []
    n = min(len(e) for e in ends)
    step_ends = [max(int(e[i]) for e in ends) for i in range(n)]
    return [t - (step_ends[i - 1] if i else 0) for i, t in enumerate(step_ends)]


def _comm_per_call(ranks: Any) -> dict[str, int] | None:
    """Collective kind -> mean comm-lane time per call (busy_ns / count), the slowest rank's."""
    out: dict[str, int] = {}
    for r in _rank_dicts(ranks):
        comm = r.get("comm")
        if not isinstance(comm, dict):
            continue
        for kind, c in comm.items():
            if isinstance(c, dict) and c.get("count") and isinstance(c.get("busy_ns"), (int, float)):
                out[str(kind)] = max(out.get(str(kind), 0), round(c["busy_ns"] / c["count"]))
    return dict(sorted(out.items())) or None


def _ops(ops: Any) -> dict[str, int] | None:
    """name -> ns from {name: ns}, or from a list of records with duration_ns (replay ops) or start and end
    (the bridge's collective records: t_start/end_ns); records sharing a name are averaged. Past
    MAX_NAMED_OPS distinct names (a long live run), records are grouped by kind instead (an all-to-all's pair
    records by `all_to_all`, `record_kind`). A collective on a group of one rank (Megatron's distributed optimizer
    with one data-parallel rank) makes no NCCL call and takes no time: it is left out, not averaged in as 0."""
    if isinstance(ops, dict):
        return {str(k): int(v) for k, v in ops.items() if isinstance(v, (int, float))} or None
    if not isinstance(ops, list):
        return None
    records = [op for op in ops if isinstance(op, dict) and not _one_rank(op)]
    by_kind = len({op.get("name") for op in records}) > MAX_NAMED_OPS and all("kind" in op for op in records)
    acc: dict[str, list[int]] = {}
    for op in records:
        kind = record_kind(str(op.get("kind")), str(op.get("name", ""))) if by_kind else ""
        key = kind or str(op.get("name") or op.get("kind") or "")
        dur = op.get("duration_ns")
        if not isinstance(dur, (int, float)):
            start = op.get("start_ns", op.get("t_start"))
            end = op.get("end_ns")
            dur = end - start if isinstance(start, (int, float)) and isinstance(end, (int, float)) else None
        if key and dur is not None:
            acc.setdefault(key, []).append(int(dur))
    return {k: round(fmean(v)) for k, v in acc.items()} or None


def _one_rank(record: dict[str, Any]) -> bool:
    """A collective record of a group of one rank (no NCCL call, no flow)."""
    group = record.get("group")
    return isinstance(group, list) and len(group) == 1


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# ----- CSV files --------------------------------------------------------------------------------------


def _read_csv(run: RunData, p: Path, required: tuple[str, ...]) -> list[dict[str, str]] | None:
    if not p.is_file():
        return None
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise InputError(f"missing column(s) {', '.join(missing)}", file=str(p), line=1)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"cannot read: {exc}", file=str(p)) from None
    run.files.append(p.name)
    return rows


def _num(row: dict[str, str], col: str, p: Path, lineno: int, cast: type = int) -> Any:
    text = row.get(col)
    if text is None or text == "":
        return None
    try:
        return cast(float(text)) if cast is int and ("." in text or "e" in text) else cast(text)
    except ValueError:
        raise InputError(f"bad number {text!r}", file=str(p), line=lineno, field=col) from None


def _load_flows(run: RunData, root: Path) -> Flows | None:
    """flows.csv (replay: standalone_fct_ns) or fct.csv (netsim: standalone_ns)."""
    for name, size_col, alone_col in (
        (S.FLOWS_CSV, "size_bytes", "standalone_fct_ns"),
        (S.FCT_CSV, "size", "standalone_ns"),
    ):
        p = root / name
        rows = _read_csv(run, p, (size_col, "start_ns", "fct_ns"))
        if rows is None:
            continue
        cols: list[list[int]] = [[], [], [], [], [], [], []]
        for i, row in enumerate(rows, 2):
            for k, col in enumerate((size_col, "start_ns", "fct_ns", alone_col)):
                v = _num(row, col, p, i)
                if v is None and k < 3:
                    raise InputError("missing value", file=str(p), line=i, field=col)
                cols[k].append(v or 0)
            for k, col in ((4, "priority"), (5, "rate_cap_bps"), (6, "nvlink")):
                v = _num(row, col, p, i)
                cols[k].append(-1 if v is None else v)
        arr = [np.asarray(c, dtype=np.int64) for c in cols]
        return Flows(*arr)
    return None


def _load_links(run: RunData, root: Path) -> list[LinkRow] | None:
    p = root / S.LINKS_CSV
    rows = _read_csv(run, p, ("utilisation",))
    if rows is None:
        return None
    out = []
    for i, row in enumerate(rows, 2):
        a = row.get("from") or row.get("src") or "?"
        b = row.get("to") or row.get("dst") or "?"
        util = _num(row, "utilisation", p, i, float)
        out.append(
            LinkRow(
                name=f"{a}->{b}",
                utilisation=util if util is not None else 0.0,
                bytes=_num(row, "bytes", p, i) or 0,
                paused_ns=_num(row, "paused_ns", p, i),
                ecn_marks=_num(row, "ecn_marks", p, i),
                max_queue_bytes=_num(row, "max_queue_bytes", p, i),
            )
        )
    return out


def _load_ports(run: RunData, p: Path, columns: tuple[str, ...], peer_col: str) -> np.ndarray | None:
    """An int64 array with `columns` in order (shape (n, len(columns))), or None if the file is absent.

    `node` is the node id: the `node_id` column where the file names nodes (every producer now), else `node`
    itself (files written before names). Names and each port's peer (`peer_col`) go to the run's maps. A column
    of plain integers is converted whole; any other (empty, decimal, bad) is read cell by cell, which names the
    first bad cell's line."""
    rows = _read_csv(run, p, columns)
    if rows is None:
        return None
    named = bool(rows) and "node_id" in rows[0]
    srcs = ["node_id" if named and col == "node" else col for col in columns]
    data = np.zeros((len(rows), len(columns)), dtype=np.int64)
    for j, src in enumerate(srcs):
        cells = [row.get(src) for row in rows]
        try:
            data[:, j] = np.array(cells, dtype=np.int64) if cells else 0
        except (ValueError, TypeError, OverflowError):
            for i, row in enumerate(rows):
                v = _num(row, src, p, i + 2)
                if v is None:
                    raise InputError("missing value", file=str(p), line=i + 2, field=src) from None
                data[i, j] = v
    if named:
        names, peers = run.node_names, run.port_peers
        for row, node, port in zip(rows, data[:, 1].tolist(), data[:, 2].tolist(), strict=True):
            if node not in names:
                names[node] = row["node"]
            if (node, port) not in peers and row.get(peer_col):
                peers[(node, port)] = row[peer_col]
    return data


# ----- Chrome trace -----------------------------------------------------------------------------------


def _load_trace(run: RunData, root: Path) -> list[Span] | None:
    """Spans of trace.json, else of the ranks' trace/rank<R>.jsonl (a run killed before it merged them);
    lanes by event category (step, compute, comm)."""
    from phantora.results.run_dir import rank_trace

    sources: list[tuple[Path, Any]] = []
    if (root / S.TRACE_JSON).is_file():
        data = _read_json(run, root / S.TRACE_JSON)
        sources.append((root / S.TRACE_JSON, data.get("traceEvents") if data else None))
    else:
        for r, chunks in sorted(rank_trace(root).items()):
            events = [ev for c in chunks for ev in (c.get("events") or [])]
            sources.append((root / S.TRACE_DIR / f"rank{r}.jsonl", events))
    if not sources:
        return None
    spans: list[Span] = []
    for p, events in sources:
        if not isinstance(events, list):
            raise InputError("no traceEvents list", file=str(p), field="traceEvents")
        for ev in events:
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            cat = str(ev.get("cat", ""))
            lane = "comm" if cat.startswith("comm") else cat if cat in ("compute", "step") else None
            if lane is None:
                continue
            try:
                start = round(float(ev["ts"]) * 1000)
                end = start + round(float(ev.get("dur", 0)) * 1000)
                rank = int(ev.get("pid", 0))
            except (KeyError, TypeError, ValueError):
                raise InputError(f"bad event {str(ev)[:80]}", file=str(p), field="traceEvents") from None
            spans.append(Span(rank, lane, str(ev.get("name", "")), start, end))
    spans.sort(key=lambda s: (s.rank, s.start_ns, s.lane))
    return spans
