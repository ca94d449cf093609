"""The run directory: its layout and its life, owned by one class, `RunDir`.

Every file a run writes into its directory is named by a `RunDir` (from `phantora.results.schema`'s names):
run, replay, netsim, nccl-tests, jobs, seeds, rerun, the bridge (cosim.json, logs) and the ranks (their step and
trace lines) ask it for the path or the writer, and nobody else joins a run directory with a file name
(tests/test_ownership.py). Its life: claimed empty, marked running, filled step by step, marked complete or failed.

A directory never holds the results of two runs, and never looks like a success it is not:

- `claim` refuses an `--out` that already holds anything, unless the user asks to `overwrite`, which
  removes what a phantora run writes there (and nothing else);
- `status.json` says `running` from the start, then `complete`, or `failed` with the reason, the rank
  that failed and the steps that finished;
- each live rank appends a line per finished step to `steps/rank<R>.jsonl` as it goes (flushed at once,
  so a run killed at step 90 keeps steps 0-89); `merge_steps` joins them into `steps.jsonl`, one line
  per step that every live rank finished;
- each live rank appends the trace events of a finished step to `trace/rank<R>.jsonl` the same way;
  `merge_trace` joins them into `trace.json`, marked partial when the run failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phantora.collectives.flow_tags import parse_ranks
from phantora.errors import InputError
from phantora.results import schema as S
from phantora.results.trace_chunks import read_chunks, write_merged

STATUS_JSON, STATUS, STEPS_JSONL, STEPS_DIR = S.STATUS_JSON, S.STATUS, S.STEPS_JSONL, S.STEPS_DIR
TRACE_JSON, TRACE_DIR = S.TRACE_JSON, S.TRACE_DIR
# Everything a phantora run, replay, netsim or nccl-tests writes into its directory (what --overwrite removes).
OUTPUT_FILES = (
    S.RESULTS_JSON, S.COSIM_JSON, S.SUMMARY_JSON, S.FLOWS_CSV, S.FCT_CSV, S.LINKS_CSV, S.PFC_CSV, S.QUEUES_CSV,
    S.DROPS_CSV, S.CNPS_CSV, S.ECN_CSV, S.FCT_TXT, S.PFC_TXT, S.NS3_CALLS_TXT, STATUS_JSON, STEPS_JSONL,
    TRACE_JSON, S.CONFIG_JSON, S.SEEDS_JSON, S.LINKS_BY_JOB_CSV, S.NCCL_TESTS_TXT, S.RUN_LOG, S.SWEEP_RUN_JSON,
    S.SCENARIO_STEPS_PNG, S.SCENARIO_STEPS_SVG, S.ENGINE_JSON,
)  # fmt: skip
OUTPUT_DIRS = (S.LOGS_DIR, TRACE_DIR, STEPS_DIR, S.JOBS_DIR, S.ALONE_DIR)


CommKey = tuple[int, str, tuple[int, ...] | None]  # a collective span: (rank, call name, its group; None: any)


class RunDir:
    """One run directory: the paths of its files (`file`, `log`, the ranks' step and trace files), the run
    directories inside it (`job`, `alone`, `seed`), its documents (`write_json`, `write_text`) and its life
    (`claim`, `running`, `complete`, `failed`, `merge_steps`, `merge_trace`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @classmethod
    def claim(cls, out: str | Path, *, overwrite: bool = False, option: str = "--out") -> RunDir:
        """`out` made an empty run directory (`claim`), or an InputError saying why it cannot be one."""
        return cls(claim(out, overwrite=overwrite, option=option))

    # ----- the layout ----------------------------------------------------------------------------------
    def file(self, name: str) -> Path:
        """The path of one of the run's files, by its schema name (`OUTPUT_FILES`); any other name is a bug."""
        if name not in OUTPUT_FILES:
            raise ValueError(f"{name!r} is not a run-directory file (phantora.results.schema names them)")
        return self.root / name

    def exists(self, name: str) -> bool:
        return self.file(name).is_file()

    def contents(self) -> list[str]:
        """What a run wrote here, sorted: its files, then its folders with a trailing `/` (nothing of the user's)."""
        files = sorted(n for n in OUTPUT_FILES if (self.root / n).is_file())
        return files + sorted(f"{d}/" for d in OUTPUT_DIRS if (self.root / d).is_dir())

    @property
    def results(self) -> Path:
        return self.file(S.RESULTS_JSON)

    @property
    def config(self) -> Path:
        return self.file(S.CONFIG_JSON)

    @property
    def logs(self) -> Path:
        """The folder of the processes' logs (rank<R>.log, coordinator.log, server.log ...)."""
        return self.root / S.LOGS_DIR

    def log(self, name: str) -> Path:
        """logs/<name>.log."""
        return self.logs / f"{name}.log"

    def rank_steps(self, rank: int) -> Path:
        """steps/rank<R>.jsonl: a live rank's line per finished step (`merge_steps` joins them)."""
        return self.root / STEPS_DIR / f"rank{rank}.jsonl"

    def rank_trace(self, rank: int) -> Path:
        """trace/rank<R>.jsonl: a live rank's trace events per finished step (`merge_trace` joins them)."""
        return self.root / TRACE_DIR / f"rank{rank}.jsonl"

    def job(self, name: str) -> RunDir:
        """jobs/<name>/: one job's own run directory in a run of several jobs."""
        return RunDir(self.root / S.JOBS_DIR / name)

    def alone(self, name: str) -> RunDir:
        """alone/<name>/: the run of several jobs with job `name` by itself (`--alone`)."""
        return RunDir(self.root / S.ALONE_DIR / name)

    def seed(self, seed: int) -> RunDir:
        """seed<S>/: one seed's run of a seed group (`--seeds N`)."""
        return RunDir(self.root / f"seed{seed}")

    # ----- documents -----------------------------------------------------------------------------------
    def write_json(self, name: str, doc: Mapping[str, Any], *, indent: int = 2, sort_keys: bool = True) -> Path:
        """One of the run's JSON documents, written atomically."""
        from phantora.results.write import write_json

        return write_json(self.file(name), doc, indent=indent, sort_keys=sort_keys)

    def write_text(self, name: str, text: str) -> Path:
        """One of the run's text files, written atomically."""
        from phantora.results.write import write_atomic

        return write_atomic(self.file(name), text)

    # ----- the run's life ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        return read_status(self.root)

    def running(self, **fields: Any) -> Path:
        return write_status(self.root, "running", **fields)

    def complete(self, **fields: Any) -> Path:
        return write_status(self.root, "complete", **fields)

    def failed(self, exc: BaseException | None = None, **fields: Any) -> Path:
        """status.json says failed: why (`failure(exc)`) and what the caller adds."""
        return write_status(self.root, "failed", **(failure(exc) if exc is not None else {}), **fields)

    def merge_steps(self, live: Iterable[int] | None = None) -> list[dict[str, Any]]:
        return merge_steps(self.root, live)

    def merge_trace(
        self,
        *,
        partial: bool = False,
        comm_args: Mapping[CommKey, Mapping[str, Any]] | None = None,
        extra_events: Sequence[Mapping[str, Any]] = (),
        notes: Mapping[str, Any] | None = None,
    ) -> Path | None:
        return merge_trace(self.root, partial=partial, comm_args=comm_args, extra_events=extra_events, notes=notes)

    def step_watcher(self, live: int, on_step: Callable[[dict[str, Any]], None]) -> StepWatcher:
        return StepWatcher(self.root, live, on_step)


def claim(out: Path | str, *, overwrite: bool = False, option: str = "--out") -> Path:
    """Make `out` an empty directory for a new run, or say clearly why it cannot be one."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{option} names a file, not a directory; choose a directory for the run", file=str(out))
    if out.is_dir():
        held = sorted(p.name for p in out.iterdir())
        if held and not overwrite:
            shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
            raise InputError(
                f"{option} already holds {len(held)} entries ({shown}): a run writes into a directory of its "
                "own. Choose a new directory, or pass --overwrite to remove what an earlier run wrote there",
                file=str(out),
            )
        if held:
            clear(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".phantora-write-check.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{option} cannot be written: {exc.strerror or exc}", file=str(out)) from None
    return out


def clear(out: Path) -> None:
    """Remove what a phantora run wrote into `out`; leave anything else the user put there."""
    for seed_dir in _seed_dirs(out):  # a seed group's runs (seeds.json lists them)
        shutil.rmtree(seed_dir, ignore_errors=True)
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    for name in OUTPUT_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
    for tmp in out.glob(".*.tmp"):  # a writer's temporary file left by a killed run
        tmp.unlink(missing_ok=True)


def _seed_dirs(out: Path) -> list[Path]:
    """The run directories of the seed group in `out` (seeds.json's `seed<S>` entries), if it is one."""
    try:
        runs = json.loads((out / S.SEEDS_JSON).read_text()).get("runs", [])
        names = [str(r["dir"]) for r in runs]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return []
    return [out / n for n in names if re.fullmatch(r"seed\d+", n)]


def write_status(out: Path, state: str, **fields: Any) -> Path:
    """status.json: `state` (running, complete, failed), when, and what the caller knows of the outcome."""
    from phantora.results.write import write_json

    doc = {"schema": STATUS, "state": state, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid()}
    return write_json(out / STATUS_JSON, {**doc, **fields}, sort_keys=False)


def failure(exc: BaseException) -> dict[str, Any]:
    """What status.json says of a failed run: the reason (the error's first line), its code, the rank."""
    if isinstance(exc, KeyboardInterrupt):
        return {"reason": "interrupted (^C, SIGINT)", "code": "interrupted"}
    text = str(exc).strip() or type(exc).__name__
    out: dict[str, Any] = {"reason": text.splitlines()[0], "code": getattr(exc, "code", type(exc).__name__)}
    if getattr(exc, "rank", None) is not None:
        out["rank"] = exc.rank  # type: ignore[attr-defined]
    return out


def read_status(out: Path) -> dict[str, Any] | None:
    """The run's status.json, or None if it has none (a run from before status files, or not a run)."""
    try:
        return dict(json.loads((Path(out) / STATUS_JSON).read_text()))
    except (OSError, ValueError):
        return None


def _rank_lines(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """The lines of each folder/rank<R>.jsonl, in order (a line cut short by a kill, and any after it, skipped)."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    for part in sorted(folder.glob("rank*.jsonl")):
        rows = []
        for line in part.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
        ranks[int(part.stem[4:])] = rows
    return ranks


def rank_steps(out: Path) -> dict[int, list[dict[str, Any]]]:
    """Each live rank's step lines, in order (a line cut short by a kill is skipped)."""
    return _rank_lines(Path(out) / STEPS_DIR)


def _trace_files(out: Path) -> dict[int, Path]:
    """rank -> its trace/rank<R>.jsonl."""
    files = (Path(out) / TRACE_DIR).glob("rank*.jsonl")
    return {int(p.stem[4:]): p for p in sorted(files) if p.stem[4:].isdigit()}


def rank_trace(out: Path) -> dict[int, list[dict[str, Any]]]:
    """Each live rank's trace chunks ({"rank", "step", "events"}), in order (a chunk cut short is skipped)."""
    return {
        r: [{"rank": c.rank, "step": c.step, "events": c.events()} for c in read_chunks(p)]
        for r, p in _trace_files(out).items()
    }


def nccl_args(collectives: Iterable[Mapping[str, Any]]) -> dict[CommKey, dict[str, Any]]:
    """(rank, collective name, group) -> {"nccl": NCCL's choice, and "redop" when not sum} from cosim.json's
    collective records, for the trace. A rank numbers its collectives per group (`all_reduce#2` on the world and
    `all_reduce#2` on a pair are two calls), so a collective's key holds its group, as its span's `group` does.
    A send/recv's record names each issuing rank's own call (`names`: the sender's send#k, the receiver's recv#j),
    as its ends' names differ and several pairs share a name (every rank's first send is send#0); a rank numbers
    them per peer, so the key's group is the peer, `(peer,)`, as its span's is, or None (any) for a rank standing
    for a mirror of the pair (rank deduplication), whose peer the record does not hold. A collective NCCL runs as
    one group of sends and receives (all-to-all, scatter, gather) has a record per pair, named `name@ranks`; its
    span gets them all: `{"algorithm": "p2p", "pairs": [{"src", "dst", "bytes", and that pair's choice}, ...]}`.
    Records and spans are keyed by the call's name without the thread that issued it (`call_of`)."""
    out: dict[CommKey, dict[str, Any]] = {}
    for rec in collectives:
        if isinstance(rec.get("nccl"), dict):
            names, group = rec.get("names"), [int(r) for r in rec.get("group", ())]
            op = {"redop": rec["redop"]} if "redop" in rec else {}  # a reduction other than sum
            keys: list[CommKey]
            if isinstance(names, list) and all("@" in str(n) for _, n in names) and len(group) == 2:
                for r, n in names:  # one pair of a collective's transfers
                    name, _, ranks = str(n).partition("@")
                    spans = out.setdefault((int(r), name, parse_ranks(ranks)), {"nccl": {"algorithm": "p2p"}})
                    pair = {"src": group[0], "dst": group[1], "bytes": rec.get("nbytes"), **rec["nccl"]}
                    spans["nccl"].setdefault("pairs", []).append(pair)
                continue
            if isinstance(names, list):
                keys = [(int(r), call_of(str(n)), _p2p_peer(int(r), group)) for r, n in names]
            else:
                keys = [(r, call_of(str(rec.get("name"))), tuple(group)) for r in group]
            for key in keys:
                out.setdefault(key, {"nccl": rec["nccl"], **op})
    return out


def call_of(name: str) -> str:
    """A call's name less the thread its rank issued it from: once a rank has started a thread, its collectives,
    sends and receives are named `all_reduce#3 from the program's thread` (session.py, for a mismatch's error), and
    a collective's coordinator record takes one member's name, so the ranks' names of one call differ in that."""
    return name.partition(" from ")[0]


def _p2p_peer(rank: int, pair: list[int]) -> tuple[int, ...] | None:
    """The group of `rank`'s span of a send/recv between `pair`: `(peer,)`; None if `rank` is not one of them."""
    if rank not in pair:
        return None
    rest = list(pair)
    rest.remove(rank)
    return (rest[0] if rest else rank,)


def comm_extra(args: Mapping[CommKey, Mapping[str, Any]], ev: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """What `nccl_args` adds to the collective span `ev`: its own call's, by rank, name and group."""
    rank, name = ev.get("pid"), str(ev.get("name"))
    if not isinstance(rank, int):
        return None
    group = tuple(ev.get("args", {}).get("group", ()))
    call = call_of(name)
    return args.get((rank, call, group)) or args.get((rank, call, None))


def merge_trace(
    out: Path,
    *,
    partial: bool = False,
    comm_args: Mapping[CommKey, Mapping[str, Any]] | None = None,
    extra_events: Sequence[Mapping[str, Any]] = (),
    notes: Mapping[str, Any] | None = None,
) -> Path | None:
    """trace.json from the ranks' trace chunks, which are then removed; None if there are none.

    A `partial` trace (of a run that failed) holds the steps each rank finished, and says so in
    `otherData` (the Chrome trace format's place for notes): `partial` and `steps_traced` per rank.
    `comm_args` adds arguments to the ranks' collective spans, by (rank, name, group): NCCL's choice (`nccl_args`);
    `extra_events` go in after the ranks' (a scenario's instant events); `notes` in `otherData`. The merge streams
    (`trace_chunks.write_merged`): it costs about a copy of the bytes, whatever the run's length."""
    from phantora.results.write import atomic_text

    out = Path(out)
    files = _trace_files(out)
    if not files:
        return None
    args = comm_args or {}
    path = out / TRACE_JSON
    with atomic_text(path) as f:
        extra = (lambda ev: comm_extra(args, ev)) if args else None
        write_merged(f, files, comm_extra=extra, extra_events=extra_events, partial=partial, notes=notes)
    for p in files.values():  # only our files: the user may have put something else there
        p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (out / TRACE_DIR).rmdir()
    return path


def merge_steps(out: Path, live: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """steps.jsonl from the ranks' step lines: one line per step that every live rank finished.

    A step ends when its slowest rank ends it: `end_ns` is the latest end, `time_ns` the time since the
    previous step's end, `compute_ns` the busiest rank's compute, `exposed_ns` the rest; memory peaks are
    the highest over ranks, communication the sum of the ranks' bytes by kind and their longest stall.
    """
    from phantora.results.write import write_atomic

    ranks = rank_steps(out)
    rows = _merged(ranks, sorted(ranks) if live is None else sorted(live))
    write_atomic(Path(out) / STEPS_JSONL, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _merged(ranks: dict[int, list[dict[str, Any]]], want: list[int]) -> list[dict[str, Any]]:
    if not want or any(r not in ranks for r in want):
        done = 0
    else:
        done = min(len(ranks[r]) for r in want)
    rows: list[dict[str, Any]] = []
    first = [ranks[r][0] for r in want] if done else []
    prev = min((x["end_ns"] - x.get("time_ns", x["end_ns"]) for x in first), default=0)  # the start (a later job)
    for i in range(done):
        lines = [ranks[r][i] for r in want]
        end = max(x["end_ns"] for x in lines)
        compute = max(x["compute_ns"] for x in lines)
        comm: dict[str, int] = {}
        for x in lines:
            for kind, nbytes in x["comm_bytes"].items():
                comm[kind] = comm.get(kind, 0) + nbytes
        rows.append(
            {
                "step": i,
                "end_ns": end,
                "time_ns": end - prev,
                "compute_ns": compute,
                "exposed_ns": max(0, end - prev - compute),
                "memory_peak_bytes": max(x["memory_peak_bytes"] for x in lines),
                "reserved_peak_bytes": max(x["reserved_peak_bytes"] for x in lines),
                "comm_bytes": dict(sorted(comm.items())),
                "comm_wait_ns": max(x["comm_wait_ns"] for x in lines),
                "ranks": len(lines),
            }
        )
        if any("storage_ns" in x for x in lines):  # checkpoint I/O (runtime/storage.py): the longest rank's,
            io = max(int(x.get("storage_ns", 0)) for x in lines)  # not exposed communication (as the summary has it)
            rows[-1]["storage_ns"] = io
            rows[-1]["exposed_ns"] = max(0, rows[-1]["exposed_ns"] - io)
            rows[-1]["storage_bytes"] = sum(int(x.get("storage_bytes", 0)) for x in lines)
        prev = end
    return rows


class StepWatcher:
    """Calls `on_step(line)` for each step every live rank has finished, as the ranks' step files grow.

    A daemon thread polls `out/steps/` every `every_s`; `stop()` reports what is left and joins it. The
    line is the one `merge_steps` gives that step (without writing steps.jsonl).
    """

    def __init__(self, out: Path, live: int, on_step: Callable[[dict[str, Any]], None], every_s: float = 0.5) -> None:
        self.out, self.live, self.on_step, self.every_s = Path(out), live, on_step, every_s
        self.seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phantora-steps", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def poll(self) -> None:
        lines = _merged(rank_steps(self.out), list(range(self.live)))  # none until every live rank has a file
        for line in lines[self.seen :]:
            self.on_step(line)
        self.seen = max(self.seen, len(lines))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()
