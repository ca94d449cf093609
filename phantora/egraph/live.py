"""Recording a live run: attach a `GraphRecorder` to a rank's session, and `record_run` around the launcher.

`attach(session, directory)` wraps, on that one session object, the calls through which a rank's time
moves: ``charge`` (compute ops), the bridge client's ``collective`` and ``p2p`` (issues, with the very
handles the bridge sees), ``join`` (waits), ``step`` and ``finish``, so phantora.runtime needs no hook of
its own.

`record_run(cfg, directory)` runs `cfg.script` with `phantora.egraph.record_script` as the ranks'
wrapper, which attaches the recorder in each rank before starting the user's script, then merges the
ranks' parts into the graph format with the run's configuration as ``meta``. In a deduplicated run only
the live ranks record; the merge gives each mirrored rank its live rank's program on shifted groups
(`phantora.egraph.recorder.mirror_parts`). This module imports no torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from phantora.egraph.format import ExecGraph
from phantora.egraph.recorder import GraphRecorder, finalize_recording

ENV_DIR = "PHANTORA_RECORD_DIR"
SCRIPT = Path(__file__).with_name("record_script.py")


class _RecordingClient:
    """The bridge client, telling the recorder about every issue (same handle, same issue time)."""

    def __init__(self, inner: Any, rec: GraphRecorder) -> None:
        self._inner, self._rec = inner, rec

    def collective(self, **kw: Any) -> int:
        h = self._inner.collective(**kw)
        g = kw["group"]
        self._rec.collective(h, g, kw["seq"], kw["kind"], kw["nbytes"], kw["dtype"], kw["root"], kw["t_issue_ns"])
        return h

    def p2p(self, **kw: Any) -> int:
        h = self._inner.p2p(**kw)
        self._rec.p2p(h, kw["peer"], kw["is_send"], kw["tag"], kw["seq"], kw["nbytes"], kw["t_issue_ns"])
        return h

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def attach(session: Any, directory: str | Path) -> GraphRecorder:
    """Record `session` (a phantora.runtime.session.RankSession) into DIR/parts/rank<R>.msgpack at finish."""
    rec = GraphRecorder(session.rank, session.world_size)
    session.client = _RecordingClient(session.client, rec)
    charge, join, step, finish = session.charge, session.join, session.step, session.finish

    def charge_rec(name: str, cost: Any) -> None:
        start = session.clock.compute_ns
        charge(name, cost)
        if cost.ns:
            rec.compute(name, start, int(cost.ns))

    def join_rec(p: Any) -> int:
        t = join(p)
        for h in p.handles:
            rec.wait(h, t)
        return t

    def step_rec() -> int:
        index = len(session.step_ends)
        d = step()
        rec.step(index, session.step_ends[-1])
        return d

    def finish_rec() -> Any:
        res = finish()
        rec.finish(directory, session.clock.now())
        return res

    session.charge, session.join, session.step, session.finish = charge_rec, join_rec, step_rec, finish_rec
    return rec


def record_run(cfg: Any, directory: str | Path) -> tuple[Any, ExecGraph]:
    """Launch `cfg` (a phantora.runtime.launcher.RunConfig) with every live rank recorded; return (report, graph)."""
    from phantora.collectives.spec import AlgoOptions
    from phantora.runtime.launcher import launch, plan_processes, resolve_topology

    _, world, live = plan_processes(cfg, resolve_topology(cfg.topology))
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    report = launch(dataclasses.replace(cfg, wrapper=str(SCRIPT), env={**cfg.env, ENV_DIR: str(d)}))
    run = dict(report.summary.get("run", {}))
    meta = {"source": "phantora run", "run": run, "algo": dataclasses.asdict(AlgoOptions())}
    return report, finalize_recording(d, meta=meta, live=live)
