"""The transfers of one NCCL group launch: a communicator's grouped send/recvs that start together.

nccl-tests' sendrecv_perf issues every rank's send and receive in one group (ncclGroupStart/End), all in flight at
once, and phantora rates such a group's pairs together where they share a PCIe host's links (`Collective.inflight`,
nccl/pci_p2p.py). A torch program's `batch_isend_irecv` (or isend/irecv in a coalescing block) is the same launch,
but the coordinator matches and launches its pairs one by one: here it gathers the pairs on one communicator that
start at the same time, those launched already and those still held, so that every pair is rated with all of them.
Pairs of one group that start at different times (a rank that issued its batch later) are rated without each other.
"""

from __future__ import annotations

from bridge.launch_order import HeldRendezvous
from bridge.matching import Rendezvous

Pair = tuple[int, int]


def grouped_comm(rv: Rendezvous) -> tuple[int, ...]:
    """The communicator both ends of a send/recv rendezvous named (`Call.comm`); () when they differ or name none."""
    comms = {c.comm for c in rv.calls.values()}
    return comms.pop() if len(comms) == 1 else ()


class P2pBatches:
    """The grouped pairs launched at the current start time, per communicator."""

    def __init__(self) -> None:
        self._t: int | None = None
        self._launched: dict[tuple[int, ...], set[Pair]] = {}

    def inflight(self, rv: Rendezvous, t: int, held: HeldRendezvous) -> tuple[Pair, ...]:
        """The (src, dst) pairs in flight with the send/recv `rv` starting at `t` on its communicator, its own
        among them (sorted); () for a lone send/recv or one alone in its launch."""
        comm = grouped_comm(rv)
        if not comm:
            return ()
        if t != self._t:
            self._t, self._launched = t, {}
        mine = self._launched.setdefault(comm, set())
        mine.add((rv.key[1], rv.key[2]))
        others = {(o.key[1], o.key[2]) for o in held.at(t) if o.key[0] == "p2p" and grouped_comm(o) == comm}
        together = mine | others
        return tuple(sorted(together)) if len(together) > 1 else ()
