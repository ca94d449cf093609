"""`GraphRecorder`: the hook a live rank calls to record its execution graph (`phantora run --record DIR`).

One recorder per rank process. The runtime calls it with what the rank already knows:

- ``compute(name, start_ns, dur_ns, stream=0)``: an op ran on a stream;
- ``collective(handle, group, seq, kind, nbytes, dtype, root, issue_ns, stream=0, before=())``: a collective was
  issued (``root`` a global rank, as the bridge client takes it; ``group`` global ranks in group order;
  ``before`` the handles of the rank's calls it starts after, as the coordinator orders them);
- ``p2p(handle, peer, is_send, tag, seq, nbytes, issue_ns, stream=0, before=(), conn=None, comm=(), launch=None)``:
  one side of a transfer (``conn``: a lone send's communicator, any name the rank gives it; ``launch``: the NCCL
  group launch on ``comm`` it is part of, any name, whose issue times the graph keeps: ``recorded.launch_issue_ns``);
- ``wait(handle, t_ns, stream=0)``: the stream joined the handle's completion at t_ns;
- ``handoff(handle, t_ns, stream=0)``: the stream joined a lone send's hand-off at t_ns (its flow ends later);
- ``step(index, t_ns, stream=0)``: end of a training step (joins every handle not yet waited);
- ``finish(directory, t_ns=None)``: write ``DIR/parts/rank<R>.msgpack``.

After every rank finished, one process calls `finalize_recording(DIR, meta)`, which deduplicates the
parts into the graph format of `phantora.egraph.format` and removes ``parts/``.

Durations are kept, absolute times are not (they would make equal ranks differ). The recorder keeps
its own copy of each stream's clock: if an op or an issue starts later than the stream could have
(time the rank spent outside anything it was told about), the gap is recorded as an ``idle`` compute
node, so replay on the recording network still reproduces the recorded times; ``idle_ns`` counts it.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import msgpack

from phantora.egraph.builder import ProgramBuilder
from phantora.egraph.format import (
    EAGER_STREAM,
    LAUNCH_ISSUE,
    LAUNCH_RELEASE,
    VERSION,
    ExecGraph,
    NcclEnv,
    Program,
    assemble,
    save,
)
from phantora.errors import InputError, PhantoraError

PART_DIR = "parts"
PART_FORMAT = "phantora-egraph-part"
IDLE = "idle"


class GraphRecorder:
    """Records one rank's nodes; cheap enough to call on every aten op."""

    def __init__(self, rank: int, world: int | None = None) -> None:
        self.rank = rank
        self.world = world
        self.b = ProgramBuilder(rank)
        self.lane: dict[int, int] = {}  # stream -> when it is free, as far as the recorder knows
        self.handles: dict[int, int] = {}  # handle -> node index
        self.unwaited: dict[int, None] = {}  # handles issued and not yet waited (insertion order)
        self.waited: set[tuple[int, int]] = set()  # (stream, handle)
        self.handed: set[tuple[int, int]] = set()  # (stream, handle) of sends joined at their hand-off
        self.unknown: set[int] = set()  # streams whose clock a wait moved to a time the recorder was not told
        self.conns: dict[Hashable, int] = {}  # the communicators of lone sends, by the rank's name -> P2P.conn
        self.step_ends: list[int] = []
        self.launch_issue: list[list[int]] = []  # [issued, joined] ns of each P2P node of a group launch, in order
        self.launch_release: list[int] = []  # window mode: the ns its rank was last released at, each such node
        self.joined = 0  # the latest completion (or hand-off) the rank joined: it ran on from there
        self.idle_ns = 0
        self.end_ns = 0
        self.finished = False

    # ----- helpers ------------------------------------------------------------------------------------------------
    def _catch_up(self, stream: int, t: int) -> None:
        if stream in self.unknown:  # it waited for a send's flow, whose end it was not told: t is that end or later
            self.unknown.discard(stream)
            self.lane[stream] = max(self.lane.get(stream, 0), t)
        lane = self.lane.get(stream, 0)
        if t > lane:
            self.b.compute(IDLE, t - lane, stream)
            self.idle_ns += t - lane
            self.lane[stream] = t

    # ----- the hook -----------------------------------------------------------------------------------------------
    def compute(self, name: str, start_ns: int, dur_ns: int, stream: int = 0) -> None:
        """An op of `dur_ns` started at `start_ns` on `stream`."""
        self._catch_up(stream, int(start_ns))
        self.b.compute(name, int(dur_ns), stream)
        self.lane[stream] = max(self.lane.get(stream, 0), int(start_ns)) + int(dur_ns)

    def collective(
        self,
        handle: int,
        group: list[int] | tuple[int, ...],
        seq: int,
        kind: str,
        nbytes: int,
        dtype: str,
        root: int | None,
        issue_ns: int,
        stream: int = 0,
        before: tuple[int, ...] = (),
        redop: str = "sum",
        nccl_env: NcclEnv | None = None,
        pg: int = 0,
        group_sizes: tuple[int, ...] = (),
        group_dtypes: tuple[str, ...] = (),
        group_kinds: tuple[str, ...] = (),
        group_redops: tuple[str, ...] = (),
        group_roots: tuple[int | None, ...] = (),
        host: bool = False,
    ) -> None:
        """A collective issued at `issue_ns` on process group `pg` over its ranks (Coll.pg); `root` is a global rank
        (or None); it starts after the rank's calls
        `before` (handles); `redop`: its reduction; `nccl_env`: its communicator's NCCL_* variables where the program
        set its own (None: the run's); `group_sizes`: a coalesced call's calls' bytes; `group_dtypes`: their dtypes
        where they differ; `group_kinds`, `group_redops`, `group_roots` (global ranks): their kinds, reductions and
        roots where they differ; `host`: a plain gloo group's (Coll.host)."""
        group = tuple(int(r) for r in group)
        self._catch_up(stream, int(issue_ns))
        local = None
        if root is not None:
            if root not in group:
                raise PhantoraError(f"rank {self.rank}: root {root} is not in the group {list(group)}")
            local = group.index(root)
        if any(r is not None and r not in group for r in group_roots):
            raise PhantoraError(f"rank {self.rank}: group roots {list(group_roots)} are not in the group {list(group)}")
        roots = tuple(None if r is None else group.index(r) for r in group_roots)
        after = self._nodes(before)
        idx = self.b.collective(
            kind, group, nbytes, dtype, local, seq, stream, after=after, redop=redop, nccl_env=nccl_env, pg=pg,
            group_sizes=group_sizes, group_dtypes=group_dtypes, group_kinds=group_kinds, group_redops=group_redops,
            group_roots=roots, host=host,
        )  # fmt: skip
        self._issued(handle, idx)

    def p2p(
        self,
        handle: int,
        peer: int,
        is_send: bool,
        tag: int,
        seq: int,
        nbytes: int,
        issue_ns: int,
        stream: int = 0,
        before: tuple[int, ...] = (),
        conn: Hashable = None,
        comm: tuple[int, ...] = (),
        nccl_env: NcclEnv | None = None,
        launch: Hashable = None,
        released: int | None = None,
        pg: int = 0,
        host: bool = False,
    ) -> None:
        """One side of a transfer issued at `issue_ns` on process group `pg` of those holding both ends (P2P.pg),
        starting after the rank's calls `before` (handles); `conn`:
        the communicator a lone send runs on, as the rank names it (numbered here in order of first use, P2P.conn);
        `comm`: its global ranks when it is not the pair's own (P2P.comm); `nccl_env` as a collective's; `launch`:
        the NCCL group launch on `comm` it is part of, as the rank names it (P2P.launch), its issue time kept, and in
        window mode `released`, the network's ns the coordinator last released the rank at (`recorded.
        launch_release_ns`); `host`: a plain gloo group's (P2P.host)."""
        self._catch_up(stream, int(issue_ns))
        number = self.conns.setdefault(conn, len(self.conns)) if conn is not None else 0
        after = self._nodes(before)
        node = self.b.p2p(
            peer,
            is_send,
            nbytes,
            tag,
            seq,
            stream,
            after=after,
            conn=number,
            comm=comm or None,
            nccl_env=nccl_env,
            launch=launch,
            pg=pg,
            host=host,
        )
        if launch is not None:  # the coordinator knows of it from `joined` on (the rank blocked until then)
            self.launch_issue.append([int(issue_ns), self.joined])
            if released is not None:
                self.launch_release.append(int(released))
        self._issued(handle, node)

    def _nodes(self, handles: tuple[int, ...]) -> list[int]:
        """The nodes of earlier calls, by handle."""
        missing = [h for h in handles if h not in self.handles]
        if missing:
            raise PhantoraError(f"rank {self.rank}: a call starts after handle {missing[0]}, which was never issued")
        return [self.handles[h] for h in handles]

    def _issued(self, handle: int, idx: int) -> None:
        if handle in self.handles:
            raise PhantoraError(f"rank {self.rank}: handle {handle} recorded twice")
        self.handles[handle] = idx
        self.unwaited[handle] = None

    def wait(self, handle: int, t_ns: int, stream: int = 0) -> None:
        """`stream` joined the completion of `handle` (completed at `t_ns`). Repeated waits are no-ops."""
        if handle not in self.handles:
            raise PhantoraError(f"rank {self.rank}: wait on handle {handle}, which was never issued")
        self.joined = max(self.joined, int(t_ns))
        if (stream, handle) in self.waited:
            return
        self.waited.add((stream, handle))
        self.unwaited.pop(handle, None)
        self.b.wait([self.handles[handle]], stream)
        if (stream, handle) in self.handed:  # t_ns is its hand-off; its flow's end comes with the next time told
            self.unknown.add(stream)
        else:
            self.lane[stream] = max(self.lane.get(stream, 0), int(t_ns))

    def handoff(self, handle: int, t_ns: int, stream: int = 0) -> None:
        """`stream` joined the hand-off of the lone send `handle` at `t_ns` (its flow ends later: a `wait` on it, or
        the step's synchronise, joins that). Repeats are no-ops."""
        if handle not in self.handles:
            raise PhantoraError(f"rank {self.rank}: hand-off of handle {handle}, which was never issued")
        self.joined = max(self.joined, int(t_ns))
        if (stream, handle) in self.handed or (stream, handle) in self.waited:
            return
        self.handed.add((stream, handle))
        self.b.wait([self.handles[handle]], stream, handoff=True)
        self.lane[stream] = max(self.lane.get(stream, 0), int(t_ns))

    def eager(self, handle: int) -> None:
        """The send `handle` is a lone send within its connection's buffer, whose hand-off the calls after it
        follow (the live coordinator's stream order): a hand-off wait on `EAGER_STREAM`, which takes no time there
        and which the replay reads only as that mark (egraph/replay.py)."""
        if handle not in self.handles:
            raise PhantoraError(f"rank {self.rank}: eager send {handle}, which was never issued")
        self.b.wait([self.handles[handle]], EAGER_STREAM, handoff=True)

    def _wait_all(self, t_ns: int, stream: int) -> None:
        self.joined = max(self.joined, int(t_ns))
        refs = [self.handles[h] for h in self.unwaited]
        for h in self.unwaited:
            self.waited.add((stream, h))
        self.unwaited.clear()
        if refs:  # their completion times are unknown here: trust t_ns
            self.b.wait(refs, stream)
            self.lane[stream] = max(self.lane.get(stream, 0), int(t_ns))

    def step(self, index: int, t_ns: int, stream: int = 0) -> None:
        """End of step `index` at `t_ns`: a synchronise (joins every handle not yet waited), then a step mark."""
        self._wait_all(t_ns, stream)
        self._catch_up(stream, int(t_ns))
        self.b.step(index, stream)
        self.step_ends.append(int(t_ns))

    def program(self) -> tuple[Program, list[tuple[int, ...]]]:
        return self.b.build(f"rank {self.rank}")

    def finish(self, directory: str | Path, t_ns: int | None = None) -> Path:
        """Join everything and write this rank's part file; return its path."""
        if self.finished:
            raise PhantoraError(f"rank {self.rank}: the recorder already finished")
        end = max([t_ns or 0, *self.lane.values()])
        self._wait_all(end, 0)
        self.end_ns = end
        prog, groups = self.program()
        part = {
            "format": PART_FORMAT,
            "version": VERSION,
            "rank": self.rank,
            "world": self.world,
            "program": prog.encode(),
            "groups": [list(g) for g in groups],
            "step_ends_ns": self.step_ends,
            "end_ns": end,
            "idle_ns": self.idle_ns,
            LAUNCH_ISSUE: self.launch_issue,
            **({LAUNCH_RELEASE: self.launch_release} if self.launch_release else {}),
        }
        path = Path(directory) / PART_DIR / f"rank{self.rank}.msgpack"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(part, use_bin_type=True))
        tmp.replace(path)
        self.finished = True
        return path


def _read_part(path: Path) -> dict[str, Any]:
    try:
        part = msgpack.unpackb(path.read_bytes(), raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise InputError(f"corrupt or truncated part file ({exc})", file=str(path)) from None
    if not isinstance(part, dict) or part.get("format") != PART_FORMAT:
        raise InputError(f"not a {PART_FORMAT} file", file=str(path), field="format")
    if part.get("version") != VERSION:
        raise InputError(f"part version {part.get('version')!r}, expected {VERSION}", file=str(path), field="version")
    return part


def mirror_parts(parts: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """The parts of a deduplicated run (live ranks 0..K-1 of `world`) extended to every rank.

    Rank l + j*K ran live rank l's program on l's groups shifted by j*K ranks (phantora.collectives.mirrors): a
    group whose shift has the same members stays that group (the mirror joins the same collective),
    any other is the shifted copy. Its clock is the live rank's (the class moves at its slowest
    member's pace), so the recorded times are the live rank's too.
    """
    from phantora.collectives.mirrors import Mirrors

    live = len(parts)
    m = Mirrors(world, live)
    out = list(parts)
    for r in range(live, world):
        src = parts[m.live_of(r)]
        j = r // live
        groups = []
        for g in src["groups"]:
            shifted = m.shift_group(tuple(g), j)
            groups.append(list(g) if set(shifted) == set(g) else list(shifted))
        out.append({**src, "rank": r, "groups": groups})
    return out


def finalize_recording(
    directory: str | Path, meta: dict[str, Any] | None = None, keep_parts: bool = False, live: int | None = None
) -> ExecGraph:
    """Merge DIR/parts/rank*.msgpack into DIR/graph.json + DIR/programs/; return the graph.

    `live`: the run was deduplicated, with parts from live ranks 0..live-1 only (see `mirror_parts`).
    """
    d = Path(directory)
    paths = sorted((d / PART_DIR).glob("rank*.msgpack"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise InputError("no rank parts to merge (did the ranks record?)", file=str(d / PART_DIR))
    parts = [_read_part(p) for p in paths]
    ranks = [int(p["rank"]) for p in parts]
    expected = len(parts) if live is None else live
    if ranks != list(range(expected)):
        missing = sorted(set(range(max(expected, max(ranks) + 1))) - set(ranks))
        raise InputError(f"rank parts missing: {missing}", file=str(d / PART_DIR))
    world = int(parts[0].get("world") or len(parts))
    if live is not None and live < world:
        parts = mirror_parts(parts, world)
    progs = [
        (Program.decode(p["program"], f"{d / PART_DIR} rank {p['rank']}"), [tuple(g) for g in p["groups"]])
        for p in parts
    ]
    recorded = {
        "step_ends_ns": [list(p["step_ends_ns"]) for p in parts],
        "end_ns": [int(p["end_ns"]) for p in parts],
        "idle_ns": [int(p.get("idle_ns", 0)) for p in parts],
    }
    if any(p.get(LAUNCH_ISSUE) for p in parts):  # kept only where a rank launched a group (graphs without: as before)
        recorded[LAUNCH_ISSUE] = [[[int(x) for x in t] for t in p.get(LAUNCH_ISSUE, [])] for p in parts]
    if any(p.get(LAUNCH_RELEASE) for p in parts):  # a window-mode run's (an exact one's has none)
        recorded[LAUNCH_RELEASE] = [[int(t) for t in p.get(LAUNCH_RELEASE, [])] for p in parts]
    graph = assemble(progs, meta, recorded)
    graph.check(str(d))
    save(graph, d)
    if not keep_parts:
        for p in paths:
            p.unlink()
        try:
            (d / PART_DIR).rmdir()
        except OSError:
            pass
    return graph
