"""Several jobs on one fabric: each job's flows as if it ran alone (issue 35: out of the coordinator).

A job's flows get ECMP keys counted from 0 in its own order, so its routes do not change when it gets
neighbours (a slowdown is contention, not hashing luck), and the job's traffic class when its spec names one.
The bytes each job puts on each channel are counted for links_by_job.csv.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from phantora.netsim.base import Flow
from phantora.topology.model import Topology


class JobTraffic:
    """Per-job ECMP keys, traffic classes and channel bytes (`priorities[j]`: job j's class, None = the flows')."""

    def __init__(self, topology: Topology, priorities: Sequence[int | None]) -> None:
        self.topology = topology
        self.priorities = list(priorities)
        self.next_key = [0] * len(self.priorities)  # each job's next ECMP key
        self.channel_bytes: list[dict[int, int]] = [{} for _ in self.priorities]  # job -> channel -> bytes

    def stamp(self, job: int, flows: Sequence[Flow]) -> tuple[list[Flow], int]:
        """`flows` with job `job`'s own consecutive ECMP keys and class, and the key of the first; their bytes
        are added to the job's channels (along the routes those keys choose)."""
        key0 = key = self.next_key[job]
        prio = self.priorities[job]
        use = self.channel_bytes[job]
        out = []
        for f in flows:
            if f.size and f.src != f.dst:
                for ch in self.topology.route(f.src, f.dst, key, f.via_nic):
                    use[ch] = use.get(ch, 0) + f.size
            out.append(dataclasses.replace(f, key=key, priority=f.priority if prio is None else prio))
            key += 1
        self.next_key[job] = key
        return out, key0
