"""The set-up of one run, written by the launcher into the run directory and read by the
coordinator and the network server: topology, the engine (`EngineSpec`, window included), algorithm.

msgpack, never pickle. The topology travels as its nodes and links and is rebuilt with the public
`Topology` API, so both processes route exactly as the launcher's topology does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from bridge.errors import BridgeError
from bridge.protocol import MAX_MESSAGE_BYTES
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.engine_spec import EngineSpec
from phantora.topology.model import Topology
from phantora.topology.wire import topology_from_dict, topology_to_dict


def options_to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass (AlgoOptions, PacketConfig ...) or a dict -> a plain msgpack-able dict."""
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return dict(obj)
    raise BridgeError(f"options must be a dataclass or a dict, got {type(obj).__name__}")


@dataclass
class RunSpec:
    """Everything the coordinator and the network server need to know about a run."""

    topology: Topology
    world: int
    engine: EngineSpec = field(default_factory=EngineSpec)  # the network engine and the window W, whole
    live: int = 0  # rank deduplication: live rank processes standing for `world` ranks (0: all live)
    engine_in_coordinator: bool = True
    algo: dict[str, Any] = field(default_factory=dict)
    keep_flows: bool = True
    peer_timeout_s: float = 30.0
    server_timeout_s: float = 3600.0  # one engine call may legitimately run this long (ns-3)
    max_message_bytes: int = MAX_MESSAGE_BYTES  # larger requests get an "oversized" error reply
    trace_dir: str = ""  # the network server writes its engine's traces (pfc.csv, queues.csv ...) here
    jobs: list[dict[str, Any]] = field(default_factory=list)  # several jobs: bridge.jobs.JobInfo dicts; [] one job
    all_or_nothing: bool = True  # with jobs: one job's failure ends the run (False: only that job)
    background: list[list[Any]] = field(default_factory=list)  # recorded jobs' flow DAG (wire rows), ids 0..n-1
    # > 0: the launcher shows the network's progress from inside engine calls, this often (s): the coordinator asks
    # for it and passes it on (`progress` messages)
    progress_s: float = 0.0
    # a decomposition worker's groups of a workload's ops (`phantora.plan_split.group_job` maps), planned as it starts,
    # before it builds its engine: its answer beside its setup (`bridge.plan_groups.write_planned`)
    plan_jobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def live_ranks(self) -> int:
        """How many rank processes run (all of them unless ranks are deduplicated)."""
        return self.live or self.world

    @property
    def network(self) -> str:
        return self.engine.network

    @property
    def window_ns(self) -> int:
        return self.engine.window_ns

    def algo_options(self) -> AlgoOptions:
        return AlgoOptions(**self.algo)

    def to_bytes(self) -> bytes:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["topology"] = topology_to_dict(self.topology)
        d["engine"] = self.engine.to_dict()
        return msgpack.packb(d, use_bin_type=True)

    @classmethod
    def from_bytes(cls, raw: bytes) -> RunSpec:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        d["topology"] = topology_from_dict(d["topology"])
        d["engine"] = EngineSpec.from_dict(d["engine"])
        return cls(**d)

    def write(self, path: Path) -> None:
        path.write_bytes(self.to_bytes())
        path.chmod(0o600)

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        return cls.from_bytes(Path(path).read_bytes())
