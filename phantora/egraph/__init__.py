"""Execution graphs: record a live run once, replay it on other networks and scales (docs/egraph.md).

Nothing here imports torch: replay runs without a live process.
"""

from phantora.egraph.builder import ProgramBuilder, build_graph
from phantora.egraph.format import ExecGraph, Program, load, save
from phantora.egraph.recorder import GraphRecorder, finalize_recording
from phantora.egraph.replay import GraphReplayResult, plan_graph, replay_graph

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
