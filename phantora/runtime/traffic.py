"""Traffic class and loss tolerance of a rank's collectives (issue 17), and DLCP's zeros in real mode.

The run's policy comes from `--set priority=none|layer|tensor-size` and `--set dlcp=off|grads` (Options); a
script overrides it for the collectives it issues inside `phantora.runtime.traffic_class(c)` or
`phantora.runtime.loss_tolerant(bound)`. The choice travels with the collective to the coordinator (its `algo`
fields `traffic_class` and `loss_tolerance`), which gives its flows that class and loss budget
(phantora.collectives.traffic has the policies and the mapping of lost flow bytes to tensor bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from phantora.collectives.traffic import class_by_layer, class_by_size, loss_tolerant_by_policy
from phantora.rank_options import Options


class TrafficMarker:
    """Chooses the `algo` extras of each collective a rank issues; counts collectives per step for `layer`."""

    def __init__(self, priority: str = "none", dlcp: str = "off", dlcp_bound: float = 0.01) -> None:
        self.priority = priority
        self.dlcp = dlcp
        self.dlcp_bound = dlcp_bound
        self.class_override: list[int] = []  # innermost last (traffic_class contexts)
        self.loss_override: list[float] = []  # innermost last (loss_tolerant contexts)
        self._index = 0  # collectives issued in this step
        self._count = 0  # collectives issued in the step before
        self.lost_bytes = 0  # bytes zeroed so far (DLCP)
        self.last_lost: list[tuple[int, int]] = []  # the byte ranges zeroed in the last loss-tolerant collective

    @classmethod
    def from_env(cls) -> TrafficMarker:
        o = Options.from_env()
        return cls(o.priority, o.dlcp, o.dlcp_bound)

    def extras(self, kind: str, dtype: str, nbytes: int) -> dict[str, Any]:
        """The `algo` fields of one collective: its class (unless the policy and context leave the default) and
        its loss tolerance (if any). Every member of a group computes the same (same calls in the same order)."""
        out: dict[str, Any] = {}
        index = self._index
        self._index += 1
        if self.class_override:
            out["traffic_class"] = self.class_override[-1]
        elif self.priority == "layer" and self._count:
            out["traffic_class"] = class_by_layer(index, self._count)
        elif self.priority == "tensor-size":
            out["traffic_class"] = class_by_size(nbytes)
        if self.loss_override:
            if self.loss_override[-1] > 0:
                out["loss_tolerance"] = self.loss_override[-1]
        elif loss_tolerant_by_policy(self.dlcp, kind, dtype, nbytes) and self.dlcp_bound > 0:
            out["loss_tolerance"] = self.dlcp_bound
        return out

    def end_step(self) -> None:
        self._count, self._index = self._index, 0


def zero_ranges(tensors: Sequence[Any], ranges: Iterable[tuple[int, int]]) -> int:
    """Zero the byte `ranges` of the tensors laid end to end (each range widened to whole elements);
    return the bytes zeroed. Meta tensors (phantom mode) hold no data: only the bytes are counted."""
    spans = sorted(ranges)
    zeroed = 0
    base = 0
    for t in tensors:
        size = t.numel() * t.element_size()
        es = t.element_size()
        flat = t.view(-1) if t.is_contiguous() else None
        for off, length in spans:
            lo, hi = max(off, base), min(off + length, base + size)
            if lo >= hi:
                continue
            first, last = (lo - base) // es, -(-(hi - base) // es)
            zeroed += (last - first) * es
            if flat is not None and t.device.type != "meta":
                flat[first:last].zero_()
        base += size
    return zeroed
