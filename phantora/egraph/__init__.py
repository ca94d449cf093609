"""Execution graphs: record a live run once, replay it on other networks and scales (docs/egraph.md).

Nothing here imports torch: replay runs without a live process. The names below load on first use, so a
process that needs one module of the package (a replay rank, `phantora.egraph.replay_rank`) loads only that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phantora.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from phantora.egraph.builder import ProgramBuilder, build_graph
    from phantora.egraph.format import ExecGraph, Program, load, save
    from phantora.egraph.recorder import GraphRecorder, finalize_recording
    from phantora.egraph.replay import GraphReplayResult, plan_graph, replay_graph

_HOME = {
    "ProgramBuilder": "builder",
    "build_graph": "builder",
    "ExecGraph": "format",
    "Program": "format",
    "load": "format",
    "save": "format",
    "GraphRecorder": "recorder",
    "finalize_recording": "recorder",
    "GraphReplayResult": "replay",
    "plan_graph": "replay",
    "replay_graph": "replay",
}


__getattr__ = lazy_getattr(__name__, _HOME)


__all__ = [
    "ExecGraph",
    "GraphRecorder",
    "GraphReplayResult",
    "Program",
    "ProgramBuilder",
    "build_graph",
    "finalize_recording",
    "load",
    "plan_graph",
    "replay_graph",
    "save",
]
