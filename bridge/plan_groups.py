"""A decomposition worker's answer to `plan_groups`: each group of a workload's ops planned here, its flows as columns.

`phantora.plan_split.plan_group` plans a group (docs/packet-model.md, "Planning per rail on the workers"); this puts
each op's DAG on the wire as `bridge.columns` flow columns, which the driver moves to its plan's ids
(`plan_split.moved_columns`), and packs the answers in one msgpack bin.
"""

from __future__ import annotations

from typing import Any

import msgpack

from bridge.columns import flows_to_columns
from phantora.netsim.gc_pause import gc_paused
from phantora.plan_split import plan_group
from phantora.topology.model import Topology


def group_reply(topo: Topology, job: dict[str, Any]) -> dict[str, Any]:
    """`plan_group` of `job` with each op's DAG as its flows' columns (``flows``)."""
    got = plan_group(topo, job)
    for op in got.get("ops", ()):
        op["flows"] = flows_to_columns(op.pop("dag").flows)
    return got


def packed_replies(topo: Topology, jobs: list[Any], limit: int) -> bytes:
    """Every job's `group_reply`, packed as one msgpack array; past `limit` bytes, each job refused instead (the
    driver then plans in its own process)."""
    with gc_paused():  # (the flows made are dropped once packed: no cycles to collect)
        packed: bytes = msgpack.packb([group_reply(topo, job) for job in jobs], use_bin_type=True)
    if len(packed) > limit:
        refused = {"refused": f"the planned groups take {len(packed):,} bytes, over the message limit"}
        packed = msgpack.packb([refused] * len(jobs), use_bin_type=True)
    return packed
