"""What a packet engine warns of in its own settings, and telling it once, as soon as it is known.

The warnings: a switch whose buffer its ports' PFC headroom and reserve take whole, so every queue pauses
its upstream port past its reserve, at any load (`EffectiveSettings.unshared_note`); switch ports whose ECN kmin no
egress queue of their buffer can pass, so an ECN CC never acts there (`EffectiveSettings.unmarkable_note`). They
come from the engine's own report of what it runs by (`FabricObserver.effective()`, read back from ns-3), so nothing
here recomputes the fabric's defaults. Where it is told (docs/packet-model.md "Switch"):

- an engine whose fabric is in this process tells it when `make_engine` has built it (before any flow runs);
- phantora-ns3-runner (`phantora netsim`) prints its report before it runs, and netsim tells it then;
- a live run's network server (or coordinator) hands it to the launcher in its welcome (bridge), which prints it;
- an engine whose fabric runs in worker processes (``workers=N``, ``partition=N``) tells it when its engine.json is
  written, at the run's end (asking the workers at build would wait for every one of them to start).

`tell` tells a settings object's warnings once: writing engine.json at the end does not repeat them; inside
`told_once()` (`--seeds N`: one engine of the same settings a seed) a warning told before is not told again.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phantora.netsim.effective import EffectiveSettings
    from phantora.topology.model import Topology

Tell = Callable[[list[str]], None]  # given the warnings (one line each), when there are any

_told: weakref.WeakValueDictionary[int, EffectiveSettings] = weakref.WeakValueDictionary()  # id -> the object
_said: list[set[str]] = []  # inside `told_once`: the warnings told so far


def fabric_warnings(settings: EffectiveSettings, topo: Topology | None = None) -> list[str]:
    """The warnings of what an engine runs by, switches named from `topo` (else by node id): one line each."""
    names = {n.id: n.name for n in topo.nodes} if topo is not None else None
    return [note for note in (settings.unshared_note(names), settings.unmarkable_note(names)) if note]


def warning_line(warning: str) -> str:
    """How a warning is printed: "phantora: warning: ..."."""
    return f"phantora: warning: {warning}"


def to_stderr(warnings: list[str]) -> None:
    """Each warning as its `warning_line` on stderr, at once."""
    for w in warnings:
        print(warning_line(w), file=sys.stderr, flush=True)


def tell(settings: EffectiveSettings, warnings: list[str], to: Tell = to_stderr) -> None:
    """`warnings` (`fabric_warnings` of `settings`) through `to`, unless they were told already for this settings
    object (an engine's `effective()` returns the same one every time)."""
    if not warnings or _told.get(id(settings)) is settings:
        return
    _told[id(settings)] = settings
    if _said:
        warnings = [w for w in warnings if w not in _said[-1]]
        _said[-1].update(warnings)
    if warnings:
        to(warnings)


@contextmanager
def told_once() -> Iterator[None]:
    """Within the block each distinct warning is told once, whatever engines are built (the runs of `--seeds N`);
    every engine.json still records its own."""
    _said.append(set())
    try:
        yield
    finally:
        _said.pop()
