"""Which earlier sends a lone send waits to see received: its connection's NCCL_STEPS slots per channel.

NCCL's send kernel waits for a free slot of its connection for each step it writes (prims_simple.h: the
connection's head, which the receiver raises as it consumes, plus NCCL_STEPS), and a connection's steps run on
from one send to the next, so the slots of the sends still unreceived add up. Across hosts the proxy runs one send's
op per channel at a time on its shared buffer (proxy.cc `ProxyAppend` chains the next op behind it, net.cc posts a
slot only for the op it runs), so there an earlier unreceived send on a channel holds the next one whatever their
sizes. A freed slot is the sender's once the news is back (`Slots.back_ns`: inside a host the receiver's flag store
across the link, across hosts the ACK of the proxy's write, whose completion frees the slot: net.cc
`sendProxyProgress`). The slots come from `phantora.collectives.handoff.send_slots`; this module needs no NCCL
model, so a rank process can keep its windows without loading one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
NCCL_STEPS = 8  # slots per connection (src/include/device.h; collectives.nccl.tables.NCCL_STEPS)


@dataclasses.dataclass(frozen=True)
class Slots:
    """The connection slots a lone send takes: `steps[i]` of channel part i's NCCL_STEPS; `one_op`: its channels'
    proxy runs one send at a time (a shared network buffer), so any earlier unreceived send there holds it;
    `zero_copy`: NCCL moves it between registered buffers, through no slot (its kernel waits for its receiver);
    `back_ns`: how long after an earlier send's flows end its sender learns the slots are free (the path's
    propagation from the receiver back: inside a host the flag the receiver stores, across hosts the write's ACK
    that completes the proxy's isend)."""

    steps: tuple[int, ...]
    one_op: bool
    zero_copy: bool = False
    back_ns: int = 0

    @property
    def fits(self) -> bool:
        """Whether the send hands off: it fits its connections alone (else its kernel waits for its receiver's
        credits) and is not zero-copy (else it waits for its receiver's buffer)."""
        return not self.zero_copy and all(n <= NCCL_STEPS for n in self.steps)


class SlotWindow(Generic[K]):
    """One sender's connection to one peer: its handed-off sends not yet known received, oldest first, with the
    slots each holds on each channel part (`send_slots`)."""

    def __init__(self) -> None:
        self._held: list[tuple[K, tuple[int, ...]]] = []

    def admit(self, send: K, slots: Slots) -> list[K]:
        """Add `send` (which fits alone, `Slots.fits`); return the earlier sends it waits to see received, oldest
        first: the fewest oldest ones whose slots, freed, leave room for its own on every channel it uses (on a
        shared network buffer: every earlier one on those channels). They leave the window."""
        own = slots.steps
        gate = 0
        for part, n in enumerate(own):
            if n == 0:
                continue
            used = [held[part] if part < len(held) else 0 for _, held in self._held]
            k = 0
            if slots.one_op:
                k = max((i + 1 for i, u in enumerate(used) if u), default=0)
            else:
                total = sum(used)
                while total + n > NCCL_STEPS and k < len(used):
                    total -= used[k]
                    k += 1
            gate = max(gate, k)
        out = [s for s, _ in self._held[:gate]]
        self._held = self._held[gate:] + [(send, own)]
        return out
