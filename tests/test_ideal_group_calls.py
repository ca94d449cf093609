"""A group of equal calls (`Collective.group_calls`, nccl-tests' -m) under model=ideal moves every call's bytes.

The NCCL model folds a group's calls into its choice (`works`); without NCCL's choice decompose used to move one
call's bytes whatever `group_calls` said. Now the calls go together as one collective of their sum
(`decompose._calls_together`), so a ring all-reduce of m calls of S bytes over n GPUs sends 2 (n - 1) m S bytes in
all (each rank 2 (n - 1) / n of the m S), an all-gather (n - 1) m S and an all-to-all (n - 1) m S (each rank's
m S less its own share).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.topology import dgx_host

N = 8
S = 1 << 20


@pytest.mark.parametrize(
    ("kind", "algorithm", "per_byte"),
    [("all_reduce", "ring", 2 * (N - 1)), ("all_gather", "ring", N - 1), ("all_to_all", "auto", N - 1)],
)
@pytest.mark.parametrize("calls", [1, 3, 4])
def test_every_call_of_the_group_moves_its_bytes(kind: str, algorithm: str, per_byte: int, calls: int) -> None:
    coll = Collective(kind, tuple(range(N)), S, "fp32", group_calls=calls)
    dag = decompose(coll, dgx_host(N), AlgoOptions(model="ideal", algorithm=algorithm))
    assert sum(f.size for f in dag.flows) == per_byte * calls * S
