"""Placing a job's ranks on GPUs of a topology: explicit lists, or the packed, spread and random policies.

A GPU is named by its rank in the topology's natural order (GPU i = ``topology.endpoints[i]``), or by
its node name (``gpu12``). The policies choose among the GPUs no other job holds:

- ``packed``: the lowest-numbered free GPUs, so a job fills hosts and leaves one after another;
- ``spread``: one GPU per leaf switch in turn, and within a leaf one per host in turn, so a job
  touches as many leaves, then hosts, as it can;
- ``random``: a seeded uniform choice (numpy's PCG64), the same for the same seed.

The chosen GPUs are in ascending order: rank r of the job is the r-th of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phantora.errors import InputError
from phantora.topology.model import Topology

POLICIES = ("packed", "spread", "random")


def gpu_index(topo: Topology, spec: int | str, where: str) -> int:
    """A GPU named by its natural rank (an int or a digit string) or its node name -> its natural rank."""
    eps = topo.endpoints
    if isinstance(spec, str) and not spec.strip().isdigit():
        names = {topo.nodes[e].name: i for i, e in enumerate(eps)}
        if spec not in names:
            raise InputError(f"{where}: no GPU named {spec!r} in '{topo.name}'", field="placement")
        return names[spec]
    i = int(spec)
    if not 0 <= i < len(eps):
        raise InputError(f"{where}: GPU {i} is outside '{topo.name}' (GPUs 0..{len(eps) - 1})", field="placement")
    return i


def parse_gpus(topo: Topology, spec: Sequence[int | str] | str, where: str) -> list[int]:
    """An explicit GPU list: [0, 1, "gpu9"] or "0-7,16-23" -> natural ranks, each named once."""
    items: list[int | str] = []
    if isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            lo, dash, hi = part.partition("-")
            if dash and lo.strip().isdigit() and hi.strip().isdigit():
                if int(hi) < int(lo):
                    raise InputError(f"{where}: bad GPU range {part!r}", field="placement")
                items.extend(range(int(lo), int(hi) + 1))
            elif part:
                items.append(part)
    else:
        items = list(spec)
    out = [gpu_index(topo, x, where) for x in items]
    if len(set(out)) != len(out):
        twice = next(g for g in out if out.count(g) > 1)
        raise InputError(f"{where}: GPU {g_name(topo, twice)} is listed twice", field="placement")
    return out


def g_name(topo: Topology, gpu: int) -> str:
    """'3 (gpu3)': a GPU's natural rank and node name, for messages."""
    return f"{gpu} ({topo.nodes[topo.endpoints[gpu]].name})"


def domain(topo: Topology, gpu: int) -> tuple[int, int]:
    """(leaf, host) of a GPU: the first switch it attaches to (-1 if none) and its host (-1 if unknown)."""
    node = topo.endpoints[gpu]
    host = topo.nodes[node].host
    switches = sorted(v for v, _ in topo.neighbours(node) if topo.nodes[v].kind == "switch")
    return (switches[0] if switches else -1, -1 if host is None else host)


def _round_robin(groups: list[list[int]]) -> list[int]:
    """One from each group in turn, until all are taken."""
    out: list[int] = []
    queues = [list(g) for g in groups]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def choose(topo: Topology, n: int, policy: str, free: Sequence[int], seed: int = 0) -> list[int]:
    """`n` GPUs (natural ranks, ascending) from `free` by `policy`; ValueError if fewer are free."""
    if policy not in POLICIES:
        raise InputError(f"unknown placement policy {policy!r} (known: {', '.join(POLICIES)})", field="placement")
    pool = sorted(free)
    if n > len(pool):
        raise ValueError(f"{n} GPUs wanted, {len(pool)} free")
    if policy == "packed":
        return pool[:n]
    if policy == "random":
        rng = np.random.default_rng(seed)
        return sorted(int(g) for g in rng.choice(pool, size=n, replace=False))
    leaves: dict[int, dict[int, list[int]]] = {}
    for g in pool:
        leaf, host = domain(topo, g)
        leaves.setdefault(leaf, {}).setdefault(host, []).append(g)
    per_leaf = [_round_robin([hosts[h] for h in sorted(hosts)]) for _, hosts in sorted(leaves.items())]
    return sorted(_round_robin(per_leaf)[:n])


def place_run(topo: Topology, spec: str, nproc: int | None) -> tuple[Topology, int]:
    """`phantora run --placement`: (the topology with the run's ranks on the GPUs `spec` names, the rank count).

    `spec` is a policy (packed, spread, random with seed 0) for `nproc` ranks (default: every GPU), or a GPU list
    ("0-3,8-11", "gpu0,gpu8"), whose length is the rank count; rank r runs on the r-th GPU in ascending order."""
    policy = spec.strip()
    if policy in POLICIES:
        n = topo.num_ranks if nproc is None else nproc
        try:
            gpus = choose(topo, n, policy, range(topo.num_ranks))
        except ValueError as exc:
            raise InputError(f"{exc} on '{topo.name}'", field="--placement") from None
    else:
        try:
            gpus = sorted(parse_gpus(topo, policy, f"'{policy}'"))
        except InputError as exc:
            raise InputError(exc.message, field="--placement") from None
        if not gpus:
            raise InputError(f"must be {', '.join(POLICIES)} or a list of GPUs, got {spec!r}", field="--placement")
        if nproc is not None and nproc != len(gpus):
            raise InputError(f"{len(gpus)} GPUs listed for --nproc {nproc}", field="--placement")
    return topo.with_rank_order(gpus), len(gpus)
