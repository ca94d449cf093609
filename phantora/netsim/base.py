"""The `NetworkSimulator` interface that every network engine implements.

Time is integer nanoseconds everywhere. A flow moves `size` bytes from endpoint node `src` to
endpoint node `dst`. A flow with `deps` starts when all of them have completed (and not before
the time it was submitted at), plus its own `delay_ns`. Completion means the last byte has
arrived at `dst`.

The bridge, the replay tool and the runtime only ever talk to engines through this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Flow:
    """A point-to-point transfer, possibly waiting on other flows (a DAG edge set)."""

    id: int
    src: int  # endpoint node id
    dst: int  # endpoint node id
    size: int  # bytes
    deps: tuple[int, ...] = ()  # flow ids that must complete first
    delay_ns: int = 0  # extra wait after the deps (e.g. a reduction kernel)
    tag: str = ""  # who owns it, e.g. "coll7/ring/ch0/step3"
    priority: int = 3  # traffic class (HPCC priority group)
    key: int | None = None  # ECMP hash key; defaults to id


@dataclass(frozen=True, slots=True)
class Completion:
    """When a flow actually started (its deps released) and finished (last byte received)."""

    flow_id: int
    start_ns: int
    end_ns: int
    size: int
    src: int
    dst: int
    tag: str = ""


@runtime_checkable
class NetworkSimulator(Protocol):
    """What the coordinator, replay and runtime need from a network engine."""

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows that become eligible at time `at` (>= now(); engines assert it)."""
        ...

    def advance(self, until: int) -> list[Completion]:
        """Run the network to `until` ns and return the completions in (end_ns, flow_id) order."""
        ...

    def next_event_time(self) -> int | None:
        """The earliest time anything can happen inside the engine, or None if idle."""
        ...

    def now(self) -> int:
        """The engine's current time in ns."""
        ...

    def in_flight(self) -> int:
        """Flows submitted but not yet completed."""
        ...

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns."""
        ...

    def stats(self) -> dict[str, object]:
        """Engine-specific counters (events, recomputations, drops, pauses ...)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...
