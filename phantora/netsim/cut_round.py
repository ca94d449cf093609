"""A stepped partition worker's round end as one packed array (`PhantoraNetwork::CutRoundEnd`, issue 38).

The completions, their losses and the completion bounds come back from ns-3 in one call as 8-byte words, instead
of three calls returning a struct per record, each read field by field through cppyy (about 0.17 CPU s of a
worker's critical path on the MoE all-to-all of `bench/bench_partition_dag.py`, most of it cppyy's first call of
each method and field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phantora.errors import PhantoraError
from phantora.netsim.base import Completion

if TYPE_CHECKING:
    from phantora.netsim.packet import Ns3Simulator

COMPLETION_WORDS, LOSS_WORDS, BOUND_WORDS = 6, 3, 2


def unpack_round_end(packed: bytes, tags: dict[int, str]) -> tuple[list[Completion], dict[int, int]]:
    """The completions (in DrainCompletions' order, each with its tag popped from `tags` and its losses in the
    order drained) and flow id -> completion bound, from CutRoundEnd's words."""
    if len(packed) % 8:
        raise PhantoraError(f"CutRoundEnd: {len(packed)} bytes, not whole 8-byte words")
    words = memoryview(packed).cast("Q")
    signed = memoryview(packed).cast("q")
    if len(words) < 3:
        raise PhantoraError(f"CutRoundEnd: {len(words)} words, fewer than its 3 counts")
    n_done, n_lost, n_bounds = words[0], words[1], words[2]
    want = 3 + COMPLETION_WORDS * n_done + LOSS_WORDS * n_lost + BOUND_WORDS * n_bounds
    if len(words) != want:
        raise PhantoraError(f"CutRoundEnd: {len(words)} words for counts {n_done}/{n_lost}/{n_bounds} ({want})")
    lost: dict[int, list[tuple[int, int]]] = {}
    at = 3 + COMPLETION_WORDS * n_done
    for i in range(at, at + LOSS_WORDS * n_lost, LOSS_WORDS):
        lost.setdefault(words[i], []).append((words[i + 1], words[i + 2]))
    done = []
    for i in range(3, at, COMPLETION_WORDS):
        fid = words[i]
        holes = tuple(lost.get(fid, ()))
        done.append(
            Completion(
                fid, signed[i + 4], signed[i + 5], words[i + 3], words[i + 1], words[i + 2], tags.pop(fid, ""), holes
            )
        )
    at += LOSS_WORDS * n_lost
    bounds = {words[i]: signed[i + 1] for i in range(at, len(words), BOUND_WORDS)}
    return done, bounds


def round_end(sim: Ns3Simulator) -> tuple[list[Completion], dict[int, int]]:
    """`sim.take_completions()` then `sim.completion_bounds()` in one packed call (`PhantoraNetwork::CutRoundEnd`):
    a stepped partition worker's round end (its tags popped as `take_completions` pops them)."""
    return unpack_round_end(bytes(sim._net.CutRoundEnd()), sim._tags)


def last_send_end(sim: Ns3Simulator) -> int | None:
    """`PhantoraNetwork::LastSendEndBound`: a lower bound on the last completion of the flows this worker sends
    (every sender's bytes still to send at its line rate, then the least propagation); None if none is left."""
    ns = int(sim._net.LastSendEndBound())
    return None if ns < 0 else ns
