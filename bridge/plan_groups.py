"""A decomposition worker's answer to `plan_groups`: each group of a workload's ops planned here, its flows as columns.

`phantora.plan_split.plan_group` plans a group (docs/packet-model.md, "Planning per rail on the workers"); this puts
each op's DAG on the wire as `bridge.columns` flow columns, which the driver moves to its plan's ids
(`plan_split.moved_columns`), and packs the answers in one msgpack bin. A local worker given its groups in its
setup (`RunSpec.plan_jobs`) plans them as it starts, before it loads ns-3, and leaves the answer beside its setup
(`write_planned`, `PLANNED`: msgpack, written whole), where its driver reads it (`read_planned`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgpack

from bridge.columns import flows_to_columns
from phantora.netsim.gc_pause import gc_paused
from phantora.plan_split import plan_group
from phantora.topology.model import Topology

PLANNED = "planned.msgpack"  # a worker's answer to its setup's groups, in its run directory


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


def write_planned(path: Path, topo: Topology, jobs: list[Any], limit: int) -> float:
    """Plan `jobs` (`packed_replies`) and write ``{"replies": bin, "cpu": s}`` to `path` whole (renamed into place,
    owner-only): the CPU seconds taken. A planning error refuses every job (the driver then plans them itself and
    names it) instead of ending the worker."""
    cpu0 = time.process_time()
    try:
        packed = packed_replies(topo, jobs, limit)
    except Exception as exc:  # noqa: BLE001 - the driver's own plan raises it again, named
        refused = {"refused": f"planning on the worker failed: {type(exc).__name__}: {exc}"}
        packed = msgpack.packb([refused] * len(jobs), use_bin_type=True)
    cpu = time.process_time() - cpu0
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgpack.packb({"replies": packed, "cpu": cpu}, use_bin_type=True))
    os.replace(part, path)
    return cpu


def read_planned(path: Path, n: int) -> tuple[list[dict[str, Any]], float]:
    """`write_planned`'s file: the `n` replies and the CPU seconds; ValueError naming the file if it is not that."""
    try:
        got = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=True)
        replies = msgpack.unpackb(got["replies"], raw=False, strict_map_key=True)
        cpu = float(got["cpu"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a worker's planned groups ({type(exc).__name__}: {exc})") from None
    if not isinstance(replies, list) or len(replies) != n or not all(isinstance(r, dict) for r in replies):
        raise ValueError(f"{path}: {n} planned groups expected")
    return replies, cpu
