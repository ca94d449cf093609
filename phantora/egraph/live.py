"""Recording a live run: attach a `GraphRecorder` to a rank's session, and `record_run` around the launcher.

`attach(session, directory)` connects a recorder to the session's listener seam
(`phantora.runtime.session.SessionListener`): compute ops, issues (with the very handles the bridge
sees, and the calls each starts after, by the coordinator's own stream order: bridge.stream_order.StreamTails),
waits, steps and the finish, after which the rank's part is written.

`record_run(cfg, directory)` runs `cfg.script` with `phantora.egraph.record_script` as the ranks'
wrapper, which attaches the recorder in each rank before starting the user's script, then merges the
ranks' parts into the graph format with the run's configuration as ``meta``. In a deduplicated run only
the live ranks record; the merge gives each mirrored rank its live rank's program on shifted groups
(`phantora.egraph.recorder.mirror_parts`). This module imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.stream_order import StreamTails
from phantora.egraph.format import ExecGraph
from phantora.egraph.recorder import GraphRecorder, finalize_recording

if TYPE_CHECKING:
    from phantora.runtime.session import Issued

ENV_DIR = "PHANTORA_RECORD_DIR"
SCRIPT = Path(__file__).with_name("record_script.py")


class _RecorderListener:
    """A `SessionListener` that feeds a `GraphRecorder` and writes its part when the rank finishes."""

    def __init__(self, rec: GraphRecorder, directory: str | Path) -> None:
        self.rec, self.directory = rec, directory
        self.tails = StreamTails()  # the calls each call starts after, as the coordinator orders them

    def on_compute(self, name: str, start_ns: int, duration_ns: int) -> None:
        self.rec.compute(name, start_ns, duration_ns)

    def on_issue(self, call: Issued) -> None:
        before = self.tails.issued(self.rec.rank, call.stream, call.handle, call.launch, call.after)
        if call.peer is None:
            self.rec.collective(
                call.handle,
                call.group,
                call.seq,
                call.kind,
                call.nbytes,
                call.dtype,
                call.root,
                call.t_issue_ns,
                before=before,
                redop=call.redop,
                nccl_env=call.nccl_env,
                pg=call.pg,
                group_sizes=call.group_sizes,
                group_dtypes=call.group_dtypes,
                group_kinds=call.group_kinds,
                group_redops=call.group_redops,
                group_roots=call.group_roots,
                host=call.host,
            )
        else:
            send = call.kind == "send"
            lone = send and call.handoff is not None  # a lone send within its buffer: its communicator's window
            conn, comm = (call.conn, call.comm) if lone else (None, ())
            launch = None
            if call.launch_comm:  # one NCCL group on that communicator: a launch id, else its calls at one time
                comm = call.launch_comm
                launch = ("launch", call.launch) if call.launch is not None else ("at", call.t_issue_ns)
            self.rec.p2p(
                call.handle,
                call.peer,
                send,
                call.tag,
                call.seq,
                call.nbytes,
                call.t_issue_ns,
                before=before,
                conn=conn,
                comm=comm,
                nccl_env=call.nccl_env,
                launch=launch,
                released=call.released_ns,
                pg=call.pg,
                host=call.host,
            )
            if lone:  # a lone send within its buffer: calls after it follow its hand-off
                self.rec.eager(call.handle)

    def on_wait(self, handles: Sequence[int], t_done_ns: int) -> None:
        for h in handles:
            self.rec.wait(h, t_done_ns)

    def on_handoff(self, handles: Sequence[int], t_handoff_ns: int) -> None:
        for h in handles:
            self.rec.handoff(h, t_handoff_ns)

    def on_step(self, index: int, end_ns: int) -> None:
        self.rec.step(index, end_ns)

    def on_finish(self, end_ns: int) -> None:
        self.rec.finish(self.directory, end_ns)


def attach(session: Any, directory: str | Path) -> GraphRecorder:
    """Record `session` (a phantora.runtime.session.RankSession) into DIR/parts/rank<R>.msgpack at finish."""
    rec = GraphRecorder(session.rank, session.world_size)
    session.add_listener(_RecorderListener(rec, directory))
    return rec


def record_run(cfg: Any, directory: str | Path) -> tuple[Any, ExecGraph]:
    """Launch `cfg` (a phantora.launcher.RunConfig) with every live rank recorded; return (report, graph)."""
    from phantora.collectives.nccl import with_nccl_env
    from phantora.launcher import launch, plan_processes, resolve_topology, run_algo

    _, world, live = plan_processes(cfg, resolve_topology(cfg.topology))
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    report = launch(dataclasses.replace(cfg, wrapper=str(SCRIPT), env={**cfg.env, ENV_DIR: str(d)}))
    run = dict(report.summary.get("run", {}))
    algo = with_nccl_env(run_algo(cfg), cfg.env)  # the run's options, with the NCCL_* variables its ranks saw
    meta = {"source": "phantora run", "run": run, "algo": dataclasses.asdict(algo)}
    return report, finalize_recording(d, meta=meta, live=live)
