"""Stepped partition workers' records, merged as they come (issue 38): a part a round, not the whole run each time.

A stepped worker (`bridge.cut_stepper`) answers each ``records`` request with the records made since its last
answer, each with its event's order key, and its counters so far (stats, channels, transport). `SteppedRecords`
keeps what came before and merges each kind's new part after the merged ones (`record_order.KeyedMerge`), so a
request costs what the round recorded, not the whole run's records again; the counters merge as `bridge.cut_pool`
merges them. The result is `bridge.cut_pool.PartitionResult`, one keyed engine's lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bridge.cut_pool import PartitionResult, merged_counters, merged_transport
from bridge.cut_worker import KEYED_RECORDS
from phantora.netsim.hpcc_io import FctLine
from phantora.netsim.observe import CnpEvent, Drop, EcnMark, PfcEvent, QueueSample, Trim
from phantora.netsim.record_order import KeyedMerge, merge_queue_samples
from phantora.topology.model import Topology

MAKERS: dict[str, Callable[..., Any]] = {
    "fct": FctLine, "pfc": PfcEvent, "marks": EcnMark, "cnps": CnpEvent, "drops": Drop, "trims": Trim,
}  # fmt: skip


class SteppedRecords:
    """The records of `workers` stepped workers so far, one keyed engine's lists (`add` each answer, `result`)."""

    def __init__(self, workers: int, topology: Topology) -> None:
        self.topology = topology
        self.kinds = {name: KeyedMerge(name, workers) for name in KEYED_RECORDS}
        self.queues: list[list[QueueSample]] = [[] for _ in range(workers)]
        self.effective: list[tuple[str, str]] = []
        self._outs: Sequence[dict[str, Any]] = ()

    def add(self, outs: Sequence[dict[str, Any]]) -> None:
        """Every worker's answer to one ``records`` request, in group order."""
        for name, merge in self.kinds.items():
            make = MAKERS[name]
            merge.add([[make(*r) for r in o["new"][name]] for o in outs],
                      [[(k[0], k[1], k[2], k[3]) for k in o["keys"][name]] for o in outs])  # fmt: skip
        for rows, o in zip(self.queues, outs, strict=True):
            rows.extend(QueueSample(*r) for r in o["new"].get("queues", ()))
        if not self.effective and outs:
            self.effective = [(str(k), str(v)) for k, v in outs[0].get("effective", ())]
        self._outs = outs

    def result(self, wall_s: float) -> PartitionResult:
        """The merged records so far and the counters of the last answers."""
        outs = self._outs
        fct = self.kinds["fct"].out
        now = max((r.start_ns + r.fct_ns for r in fct), default=0)
        channels, stats = merged_counters(outs, self.topology)
        queues = merge_queue_samples(self.queues)
        k = self.kinds
        return PartitionResult(
            completions=[], fct=list(fct), pfc=list(k["pfc"].out), marks=list(k["marks"].out),
            cnps=list(k["cnps"].out), drops=list(k["drops"].out), trims=list(k["trims"].out), queues=queues,
            transport=merged_transport(outs), channels=channels, stats=stats, effective=self.effective, now=now,
            ties=sum(m.ties for m in k.values()), workers=[o["windows"] for o in outs], wall_s=wall_s,
        )  # fmt: skip
