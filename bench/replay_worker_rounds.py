"""Route (a)'s workers, one at a time: dump each worker's round messages from a live run, replay them in one process.

`bench_decompose.py --hybrid N` runs the driver (`HybridDecomposedSimulator`) and N worker processes, so a worker's
CPU is read off its replies and moves with the machine's load. Here:

    # the live run (the bench's hierarchical all-reduces): each worker's setup, its round messages and what it replied
    .venv/bin/python bench/replay_worker_rounds.py dump /tmp/rounds --bytes 64MiB --workers 2
    # one worker's rounds again, in this process (NetServer._serve on the same engine): CPU per round, replies checked
    .venv/bin/python bench/replay_worker_rounds.py replay /tmp/rounds --worker 0 [--profile w0.prof]
    # every worker replayed (one process each) and the busiest worker per round summed: the workers' critical path
    .venv/bin/python bench/replay_worker_rounds.py critical /tmp/rounds
    # one engine on the same DAG (submit + drain, CPU and key), for the ratio
    .venv/bin/python bench/replay_worker_rounds.py engine --bytes 64MiB
    # the driver alone against the dump's replies (no worker process): its messages checked byte for byte
    .venv/bin/python bench/replay_worker_rounds.py driver /tmp/rounds

Each process runs under the cyclic collector's run policy once set up (`use_run_policy`), as a `phantora` command and
a worker do. Every reply of a replay is checked against the live run's (sha256 of its completions, bounds, now, next
event and flows in flight): a change that alters what a worker answers fails here first.

Instructions instead of CPU seconds (load-independent; `perf stat -e instructions:u` needs hardware counters, which
a virtual machine may not give): with `--marks`, each subcommand calls ``os.getppid()`` between its parts (nothing
else here calls it), so under ``valgrind --tool=callgrind --dump-before=getppid --callgrind-out-file=cg.%p`` each
part is one dump file; ``cgparts FILES`` reads their totals (instructions executed, user mode). The parts: `engine`
set-up | submit + drain | rest; `dump` and `driver` set-up | first submit until the books | the books (they run while
the workers place their flows) | the rest of the submit and the drain | rest; `driver --starting` splits that rest
into the first round's messages | then between rounds and the driver's own work during each later round
(`_while_round`: a drain's completions built), one part each, alternating; `replay` set-up | one part per message |
rest (the replies are checked there, after the rounds: the worker's parts hold only what it does). ``cgcrit DIR
--driver D --worker W0 W1 --engine E`` (each a directory of such dump files) sums the critical path on free cores:
the driver's first submit + max(its books, the busiest worker's first round) + per later round the most of its
busiest worker and the driver's own work during it + the driver's rest between rounds; with ``--started`` (a `driver
--starting` run: the pool said its workers were still starting, so the driver kept its books before the first
round) the first submit, the books and the first round's messages are left out: they ran beside the workers' start.
It also prints every instruction from the workers' start over as many cores as workers (the driver's own work
during a round is free only on a core of its own).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decompose import fsdp_dag

from bridge.columns import completion_columns, completions_from_columns, completions_to_columns
from bridge.netserver import NetServer
from bridge.protocol import MAX_MESSAGE_BYTES, decode, encode
from bridge.runspec import RunSpec
from bridge.workers import post_message, spawn_workers, worker_spec
from phantora.netsim.base import Completion
from phantora.netsim.decompose import Outbox, RoundReply, WorkerPool
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.gc_pause import use_run_policy
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from phantora.units import parse_size_bytes

MARK = os.getppid  # the part boundary under callgrind's --dump-before=getppid (`--marks`)


def reply_digest(done: Sequence[Completion], bounds: list[int], now: int, nxt: int | None, in_flight: int) -> str:
    """What a worker answered to a round, as 16 hex digits (its CPU and wall left out)."""
    rows = [(c.flow_id, c.start_ns, c.end_ns, c.size, c.src, c.dst, c.tag, c.lost) for c in done]
    return hashlib.sha256(repr((rows, bounds, now, nxt, in_flight)).encode()).hexdigest()[:16]


def run_key(done: list[Completion]) -> str:
    """bench_decompose's key: sha256 of the sorted (id, start, end), 12 hex digits."""
    return hashlib.sha256(repr(sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)).encode()).hexdigest()[:12]


def _submit_drain(sim: Any, flows: list[Any], marks: Callable[[], Any]) -> tuple[list[Completion], float]:
    """Submit `flows` at 0 and drain: the completions and the CPU seconds between the two marks; closes `sim`."""
    try:
        marks()
        c0 = time.process_time()
        sim.submit(flows, 0)
        done = sim.drain()
        cpu = time.process_time() - c0
        marks()
    finally:
        sim.close()
    return done, cpu


def reply_message(reply: RoundReply) -> bytes:
    """A worker's reply to a round as it sent it (`bridge.netserver`'s "posted"; its CPU and wall as it read them)."""
    done = completions_to_columns(reply.completions, nested=True)
    return encode(
        "posted", reply.now, now=reply.now, in_flight=reply.in_flight, next=reply.next_event, done=done,
        bounds=reply.bounds, cpu=reply.cpu, wall=reply.wall,
    )  # fmt: skip


class _Recorder:
    """A worker pool that keeps each round's messages, the replies in the order they came and their digests (the
    pool does the work)."""

    def __init__(
        self, pool: WorkerPool, rounds: list[list[list[Any]]], digests: list[list[str]], replies: list[list[Any]]
    ) -> None:
        self.pool, self.rounds, self.digests, self.replies, self.count = pool, rounds, digests, replies, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    def round(self, posts: dict[int, tuple[int, Outbox, int]]) -> Iterator[tuple[int, RoundReply]]:
        for i, (t, out, until) in posts.items():
            self.rounds[i].append([self.count, post_message(t, out, until)])
        self.count += 1
        got: list[Any] = []
        self.replies.append(got)
        for i, reply in self.pool.round(posts):
            self.digests[i].append(
                reply_digest(reply.completions, reply.bounds, reply.now, reply.next_event, reply.in_flight)
            )
            got.append([i, reply_message(reply)])
            yield i, reply


class _Replayed:
    """A worker pool of none: each round's messages checked byte for byte against a dump's, its replies served from
    the dump in the order they came (decoded as the driver decodes a worker's)."""

    def __init__(self, d: Path, starting: bool = False, marks: Callable[[], Any] = lambda: 0) -> None:
        self.starting = starting  # (the driver then keeps its books before the first round, beside the workers' start)
        self.marks = marks  # (with `starting`: a part boundary after the first round's messages)
        n = len(json.loads((d / "meta.json").read_text())["replies"])
        self.workers = [argparse.Namespace(index=i, pid=0, pieces=[]) for i in range(n)]
        self.curve = False
        self.messages = [dict(map(tuple, _unpacked(d / f"rounds.w{i}.msgpack"))) for i in range(n)]
        self.replies = _unpacked(d / "replies.msgpack")
        self.count = 0
        self.unequal: list[tuple[int, int]] = []  # (round, worker) whose message differs from the dump's

    def round(self, posts: dict[int, tuple[int, Outbox, int]]) -> Iterator[tuple[int, RoundReply]]:
        r = self.count
        self.count += 1
        for i, (t, out, until) in posts.items():
            if post_message(t, out, until) != self.messages[i].get(r):
                self.unequal.append((r, i))
        if r == 0 and self.starting:
            self.marks()
        if sorted(posts) != sorted(i for i, _ in self.replies[r]):
            raise SystemExit(f"driver: round {r} goes to workers {sorted(posts)}, the dump's to others")
        return ((i, _reply(decode(raw, MAX_MESSAGE_BYTES))) for i, raw in self.replies[r])

    def stats(self, index: int) -> dict[str, object]:
        return {}

    def records(self, index: int, now: int, elapsed: int) -> dict[str, list[Any]]:
        return {}

    def keepalive(self) -> None:
        pass

    def close(self) -> None:
        pass


def _reply(msg: Any) -> RoundReply:
    """A worker's "posted" message as the driver's pool reads it (`bridge.workers.ServerPool._replies`)."""
    done = completion_columns(msg["done"])
    return RoundReply(done, msg["bounds"], msg["cpu"], msg["wall"], msg["now"], msg["next"], msg["in_flight"])


def _unpacked(path: Path) -> Any:
    return msgpack.unpackb(path.read_bytes(), raw=False)


def _driven(
    sim: HybridDecomposedSimulator, flows: list[Any], marks: Callable[[], Any]
) -> tuple[list[Completion], float]:
    """`_submit_drain` of the driver, with a mark before and after the books of a large batch (the workers place
    their flows meanwhile) and before and after its own work while the workers run a later round
    (`_while_round`)."""
    book: Callable[..., None] = sim._book

    def marked_book(*a: Any, handed: bool) -> None:
        if handed:
            marks()
        book(*a, handed=handed)
        if handed:
            marks()

    sim._book = marked_book  # type: ignore[method-assign,assignment]
    own: Callable[[], None] = sim._while_round

    def marked_own() -> None:
        marks()
        own()
        marks()

    sim._while_round = marked_own  # type: ignore[method-assign]
    return _submit_drain(sim, flows, marks)


def _config(args: argparse.Namespace, workers: int = 0) -> PacketConfig:
    sets = [s for s in args.set.split(",") if s] + ([f"workers={workers}"] if workers else [])
    return apply_overrides(PacketConfig(cc=args.cc), sets)


def dump(args: argparse.Namespace) -> None:
    """The live hybrid run; DIR gets setup.wI.msgpack, rounds.wI.msgpack ([[round, message], ...]) and meta.json."""
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    topo = load_topology(args.topology)
    flows = fsdp_dag(topo, parse_size_bytes(args.bytes))
    config = _config(args, args.workers)
    rounds: list[list[list[Any]]] = []
    digests: list[list[str]] = []
    replies: list[list[Any]] = []

    def spawner(topology: Any, cfg: PacketConfig, assignment: list[list[int]], side: str = "packet") -> WorkerPool:
        for i in range(len(assignment)):
            rounds.append([])
            digests.append([])
            (out / f"setup.w{i}.msgpack").write_bytes(worker_spec(topology, cfg, side).to_bytes())
        pool = spawn_workers(topology, cfg, assignment, side)
        return _Recorder(pool, rounds, digests, replies)  # type: ignore[return-value]

    sim = HybridDecomposedSimulator(topo, config, spawner)
    use_run_policy()  # (as a `phantora` command's process runs)
    done, cpu = _driven(sim, flows, MARK if args.marks else (lambda: 0))
    for i, rs in enumerate(rounds):
        (out / f"rounds.w{i}.msgpack").write_bytes(msgpack.packb(rs, use_bin_type=True))
    (out / "replies.msgpack").write_bytes(msgpack.packb(replies, use_bin_type=True))
    key = run_key(done)
    meta = {"topology": args.topology, "bytes": args.bytes, "key": key, "rounds": sim.rounds, "replies": digests}
    (out / "meta.json").write_text(json.dumps(meta))
    print(f"{len(flows)} flows, {sim.rounds} rounds, key {key}; driver CPU {cpu:.2f} s; ", end="")
    print(f"messages per worker {[len(r) for r in rounds]} -> {out}")


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """One worker's messages through `NetServer._serve` on its engine, built as the worker builds it."""
    d = Path(args.dir)
    spec = RunSpec.from_bytes((d / f"setup.w{args.worker}.msgpack").read_bytes())
    msgs = msgpack.unpackb((d / f"rounds.w{args.worker}.msgpack").read_bytes(), raw=False)
    want = json.loads((d / "meta.json").read_text())["replies"][args.worker]
    engine = make_engine(spec.engine, spec.topology)
    server = NetServer(None, engine, "", {}, MAX_MESSAGE_BYTES)  # type: ignore[arg-type]
    use_run_policy()  # (as the worker's process runs once its engine is built: bridge/netserver.py)
    marks = MARK if args.marks else (lambda: 0)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    cpu: dict[int, float] = {}
    replies: list[bytes] = []
    try:
        for r, raw in msgs:
            marks()
            c0 = time.process_time()
            if prof is not None:
                prof.enable()
            reply = server._serve(decode(raw, MAX_MESSAGE_BYTES))
            if prof is not None:
                prof.disable()
            cpu[r] = time.process_time() - c0
            assert reply is not None
            replies.append(reply)
        marks()
    finally:
        engine.close()
    got: list[str] = []
    for reply in replies:  # (checked after the rounds: the worker does not decode its own replies)
        m = decode(reply, MAX_MESSAGE_BYTES)
        done = completions_from_columns(m["done"])
        got.append(reply_digest(done, m["bounds"], m["now"], m["next"], m["in_flight"]))
    if prof is not None:
        prof.dump_stats(args.profile)
    equal = got == want
    print(f"worker {args.worker}: {len(msgs)} messages, {sum(cpu.values()):.3f} CPU s, replies equal: {equal}")
    return {"worker": args.worker, "cpu": {str(k): v for k, v in cpu.items()}, "equal": equal}


def driver(args: argparse.Namespace) -> None:
    """The driver of the dump's run alone, its workers' replies served from the dump: every message checked."""
    d = Path(args.dir)
    meta = json.loads((d / "meta.json").read_text())
    topo = load_topology(meta["topology"])
    flows = fsdp_dag(topo, parse_size_bytes(meta["bytes"]))
    marks = MARK if args.marks else (lambda: 0)
    pool = _Replayed(d, args.starting, marks)
    sim = HybridDecomposedSimulator(topo, _config(args, len(pool.workers)), lambda *a: pool)
    use_run_policy()
    done, cpu = _driven(sim, flows, marks)
    key = run_key(done)
    equal = not pool.unequal and pool.count == len(pool.replies) and key == meta["key"]
    first = f"; first unequal (round, worker) {pool.unequal[0]}" if pool.unequal else ""
    print(f"driver: {pool.count} rounds (the dump's {len(pool.replies)}), key {key}, {cpu:.3f} CPU s; ", end="")
    print(f"messages and key equal: {equal}{first}")


def critical(args: argparse.Namespace) -> None:
    """Every worker replayed in a process of its own; per round its busiest worker's CPU, summed."""
    n = len(json.loads((Path(args.dir) / "meta.json").read_text())["replies"])
    per = []
    for i in range(n):
        got = subprocess.run(
            [sys.executable, __file__, "replay", args.dir, "--worker", str(i), "--json"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        per.append(json.loads(got.stdout.splitlines()[-1]))
    rounds = {r for p in per for r in p["cpu"]}
    busiest = sum(max(p["cpu"].get(r, 0.0) for p in per) for r in rounds)
    sums = " / ".join(f"{sum(p['cpu'].values()):.3f}" for p in per)
    equal = all(p["equal"] for p in per)
    print(f"busiest worker per round, summed: {busiest:.3f} CPU s (workers {sums}); replies equal: {equal}")


def engine(args: argparse.Namespace) -> None:
    """One engine (ns-3 + fluid NVLink in this process) on the same DAG: submit + drain."""
    topo = load_topology(args.topology)
    flows = fsdp_dag(topo, parse_size_bytes(args.bytes))
    sim = make_engine(EngineSpec("ns3", _config(args)), topo)
    use_run_policy()  # (as a `phantora` command's process runs)
    done, cpu = _submit_drain(sim, flows, MARK if args.marks else (lambda: 0))
    print(f"one engine: {len(flows)} flows, {cpu:.2f} CPU s, key {run_key(done)}")


def _parts(files: list[str]) -> list[int]:
    """The instructions of each callgrind dump file (`totals:`), in part order."""
    parts = []
    for f in files:
        text = Path(f).read_text(errors="replace")
        part = re.search(r"^part: (\d+)", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if total is None:
            raise SystemExit(f"cgparts: {f}: no 'totals:' line (not a callgrind output file)")
        parts.append((int(part.group(1)) if part else 0, int(total.group(1))))
    return [t for _, t in sorted(parts)]


def cgparts(args: argparse.Namespace) -> None:
    print(json.dumps(_parts(args.files)))


def cgcrit(args: argparse.Namespace) -> None:
    """The critical path in instructions from callgrind dump directories (module docstring), against one engine."""
    d = Path(args.dir)
    drv = _parts([str(p) for p in Path(args.driver).glob("cg.*")])
    if len(drv) < 5:
        raise SystemExit(f"cgcrit: {args.driver}: {len(drv)} parts, not a marked driver run's 5 or more")
    first, books, rest = drv[1], drv[2], drv[3]  # (each driver part, in order: set-up, ..., rest)
    msgs, idle, serial = 0, [], [rest]
    if len(drv) > 5:  # (a `driver --starting` run: the first round's messages, then between rounds and during them)
        msgs, serial, idle = rest, drv[4:-1][0::2], drv[4:-1][1::2]
        rest = sum(serial)
    per: list[dict[int, int]] = []
    for i, w in enumerate(args.worker):
        msgs_w = _unpacked(d / f"rounds.w{i}.msgpack")
        parts = _parts([str(p) for p in Path(w).glob("cg.*")])
        if len(parts) != len(msgs_w) + 2:
            raise SystemExit(f"cgcrit: {w}: {len(parts)} parts for {len(msgs_w)} messages (+ set-up and rest)")
        per.append({r: parts[k + 1] for k, (r, _) in enumerate(msgs_w)})
    rounds = sorted({r for p in per for r in p})
    busiest = [max(p.get(r, 0) for p in per) for r in rounds]
    if idle and len(idle) != len(rounds) - 1:
        raise SystemExit(f"cgcrit: {len(idle)} parts of the driver's own during rounds for {len(rounds) - 1} rounds")
    later = sum(map(max, busiest[1:], idle)) if idle else sum(busiest[1:])  # (its own work overlaps each round)
    path = first + max(books, busiest[0]) + later + msgs + rest
    if args.started:  # the first submit, the books (and the first round's messages) ran beside the workers' start
        path = busiest[0] + later + rest
    g = 1e9
    whole = msgs + rest + sum(idle)
    print(f"driver: first submit {first / g:.3f} G, books {books / g:.3f} G, rest {whole / g:.3f} G")
    if idle:
        print(f"  of the rest: the first round's messages {msgs / g:.3f} G, between rounds {rest / g:.3f} G, during "
              f"rounds {sum(idle) / g:.3f} G (per round at most {max(idle) / g:.3f} G)")  # fmt: skip
    print(f"workers: {' / '.join(f'{sum(p.values()) / g:.3f}' for p in per)} G, busiest per round summed "
          f"{sum(busiest) / g:.3f} G (first round {busiest[0] / g:.3f} G)")  # fmt: skip
    line = f"critical path {first / g:.3f} + max({books / g:.3f}, {busiest[0] / g:.3f}) + {later / g:.3f}"
    if args.started:
        line = f"critical path from the workers' start {busiest[0] / g:.3f} + {later / g:.3f}"
    print(f"{line} + {rest / g:.3f} = {path / g:.3f} G", end="")
    if args.engine:
        one = _parts([str(p) for p in Path(args.engine).glob("cg.*")])[1]
        print(f"; one engine {one / g:.3f} G: {one / path:.3f}x (1.7x allows {one / 1.7 / g:.3f} G)", end="")
    print()
    if idle and args.started:  # on exactly as many cores as workers, the driver's work during rounds is not free
        total = sum(sum(p.values()) for p in per) + rest + sum(idle)
        print(f"every instruction from the workers' start over {len(per)} cores: {total / len(per) / g:.3f} G", end="")
        if args.engine:
            print(f" ({one * len(per) / total:.3f}x)", end="")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("dump", "engine"):
        p = sub.add_parser(name)
        if name == "dump":
            p.add_argument("dir")
            p.add_argument("--workers", type=int, default=2)
        p.add_argument("--topology", default="rail128")
        p.add_argument("--bytes", default="64MiB")
        p.add_argument("--cc", default="dcqcn")
        p.add_argument("--set", default="nvlink=fluid,wire=roce4k,nic_latency=1us")
        p.add_argument("--marks", action="store_true")
    p = sub.add_parser("replay")
    p.add_argument("dir")
    p.add_argument("--worker", type=int, default=0)
    p.add_argument("--profile", help="cProfile the serving only, into this file")
    p.add_argument("--json", action="store_true", help="last line: per-round CPU as JSON")
    p.add_argument("--marks", action="store_true")
    p = sub.add_parser("critical")
    p.add_argument("dir")
    p = sub.add_parser("driver")
    p.add_argument("dir")
    p.add_argument("--cc", default="dcqcn")
    p.add_argument("--set", default="nvlink=fluid,wire=roce4k,nic_latency=1us")
    p.add_argument("--marks", action="store_true")
    p.add_argument("--starting", action="store_true", help="the pool says its workers are still starting (books first)")
    p = sub.add_parser("cgcrit")
    p.add_argument("dir", help="the dump")
    p.add_argument("--driver", required=True, help="callgrind files of `driver DIR --marks`")
    p.add_argument("--worker", nargs="+", required=True, help="callgrind files of `replay DIR --worker I --marks`")
    p.add_argument("--engine", help="callgrind files of `engine --marks`")
    p.add_argument("--started", action="store_true", help="the first submit and books ran beside the workers' start")
    p = sub.add_parser("cgparts")
    p.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.cmd == "replay":
        got = replay(args)
        if args.json:
            print(json.dumps(got))
    else:
        cmds = {"dump": dump, "engine": engine, "critical": critical, "driver": driver, "cgparts": cgparts}
        {**cmds, "cgcrit": cgcrit}[args.cmd](args)


if __name__ == "__main__":
    main()
