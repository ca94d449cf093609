"""`ProgramBuilder`: append the nodes of one rank, with global groups, and get a slot-bound program back.

The recorder, the Kineto importer, the scaler and the tests all build programs through it, so slot
numbering (first appearance order) and seq counting (per group, in issue order) are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from phantora.collectives.spec import REDUCING
from phantora.egraph.format import (
    DTYPE_CODES,
    KIND_CODES,
    P2P,
    REDOP_CODES,
    Coll,
    Compute,
    ExecGraph,
    NcclEnv,
    Program,
    Step,
    Wait,
    assemble,
    check_group_calls,
)
from phantora.errors import InputError


class ProgramBuilder:
    """The program of one rank under construction; methods return the new node's index."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.nodes: list = []
        self.slot_groups: list[tuple[int, ...]] = []
        self._slots: dict[tuple[int, ...], int] = {}
        self._seq: dict[tuple[object, ...], int] = {}
        self._steps: dict[int, int] = {}
        self._launches: dict[Hashable, int] = {}  # the rank's NCCL group launches, by any name -> P2P.launch

    def slot(self, group: Iterable[int]) -> int:
        g = tuple(int(r) for r in group)
        s = self._slots.get(g)
        if s is None:
            s = self._slots[g] = len(self.slot_groups)
            self.slot_groups.append(g)
        return s

    def _next_seq(self, key: tuple[object, ...], seq: int | None) -> int:
        if seq is None:
            seq = self._seq.get(key, 0)
        self._seq[key] = max(self._seq.get(key, 0), seq + 1)
        return seq

    def _add(self, node: object) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def compute(self, name: str, dur_ns: int, stream: int = 0, deps: Sequence[int] = ()) -> int:
        if dur_ns < 0:
            raise InputError(f"compute '{name}': negative duration {dur_ns}", field="dur_ns")
        return self._add(Compute(stream, name, int(dur_ns), tuple(deps)))

    def collective(
        self,
        kind: str,
        group: Sequence[int],
        nbytes: int,
        dtype: str = "bf16",
        root: int | None = None,
        seq: int | None = None,
        stream: int = 0,
        deps: Sequence[int] = (),
        after: Sequence[int] = (),
        redop: str = "sum",
        nccl_env: NcclEnv | None = None,
        pg: int = 0,
        group_sizes: Sequence[int] = (),
        group_dtypes: Sequence[str] = (),
        group_kinds: Sequence[str] = (),
        group_redops: Sequence[str] = (),
        group_roots: Sequence[int | None] = (),
        host: bool = False,
    ) -> int:
        """Issue a collective; `root` is group-local; `seq` defaults to the count of earlier calls on this group
        (process group `pg` over its ranks: Coll.pg);
        `after`: earlier Coll/P2P nodes whose part on this rank must end before it starts (its NCCL stream order);
        `redop`: the reduction of an all-reduce, reduce-scatter or reduce; `nccl_env`: the NCCL_* variables its
        communicator was created with, where the program set its own (None: the run's); `group_sizes`: a coalesced
        call's calls' bytes (one NCCL group of them, summing to `nbytes`; () for one call); `group_dtypes`: their
        dtypes where they differ (the first `dtype`); `group_kinds`, `group_redops`, `group_roots`: their kinds,
        reductions and group-local roots where they differ (a device block's calls, one NCCL plan; the first the
        call's own); `host`: a plain gloo group's (Coll.host)."""
        if kind not in KIND_CODES:
            raise InputError(f"unknown collective kind {kind!r} (known: {', '.join(KIND_CODES)})", field="kind")
        if dtype not in DTYPE_CODES:
            raise InputError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_CODES)})", field="dtype")
        if redop not in REDOP_CODES or (redop != "sum" and kind not in REDUCING):
            raise InputError(f"reduction {redop!r} for {kind} (known: {', '.join(REDOP_CODES)})", field="redop")
        group = tuple(int(r) for r in group)
        if self.rank not in group:
            raise InputError(f"rank {self.rank} issues a collective on {list(group)}, not its group", field="group")
        s = self._next_seq(("c", group, pg), seq)
        slot = self.slot(group)
        sizes = tuple(int(b) for b in group_sizes) if len(group_sizes) > 1 else ()
        if sizes and (sum(sizes) != int(nbytes) or min(sizes) < 0 or kind in ("all_to_all", "barrier")):
            raise InputError(f"group sizes {list(sizes)} for a {kind} of {nbytes} B", field="group_sizes")
        types = tuple(group_dtypes) if sizes and len(set(group_dtypes)) > 1 else ()
        if types and (len(types) != len(sizes) or types[0] != dtype or not set(types) <= set(DTYPE_CODES)):
            raise InputError(
                f"group dtypes {list(types)} for the {len(sizes)} calls of a {dtype} {kind}", field="group_dtypes"
            )
        deps, after = tuple(deps), tuple(after)
        kinds = tuple(group_kinds) if sizes and len(set(group_kinds)) > 1 else ()
        redops = tuple(group_redops) if sizes and len(set(group_redops)) > 1 else ()
        roots = tuple(group_roots) if sizes and len(set(group_roots)) > 1 else ()
        node = Coll(
            stream, slot, kind, int(nbytes), dtype, root, s, deps, after, redop, nccl_env, pg, sizes, types, kinds,
            redops, roots, bool(host),
        )  # fmt: skip
        if node.mixed():
            check_group_calls(node, "<program>", "group_kinds")
            if any(r is not None and not 0 <= r < len(group) for r in roots):
                raise InputError(f"group roots {list(roots)}: not indices of {list(group)}", field="group_roots")
        return self._add(node)

    def p2p(
        self,
        peer: int,
        is_send: bool,
        nbytes: int,
        tag: int = 0,
        seq: int | None = None,
        stream: int = 0,
        deps: Sequence[int] = (),
        after: Sequence[int] = (),
        conn: int = 0,
        comm: Sequence[int] | None = None,
        nccl_env: NcclEnv | None = None,
        launch: Hashable = None,
        pg: int = 0,
        host: bool = False,
    ) -> int:
        """One side of a transfer to (send) or from (recv) `peer`, on process group `pg` of those holding both (P2P.pg);
        `after` and `nccl_env` as a collective's; `conn`:
        the communicator it runs on (P2P.conn); `comm`: that communicator's global ranks when it is not the pair's
        own (P2P.comm); `launch`: the NCCL group launch on `comm` it is part of, any name the rank gives it
        (P2P.launch numbers them in order of first use), None: none; `host`: a plain gloo group's (P2P.host)."""
        pair = (self.rank, int(peer)) if is_send else (int(peer), self.rank)
        s = self._next_seq(("p", *pair, tag, pg), seq)
        slot = self.slot(pair)
        on = self.slot(tuple(int(r) for r in comm)) if comm else -1
        if launch is not None and on < 0:
            raise InputError(f"rank {self.rank}: a transfer of a group launch needs its communicator", field="comm")
        number = -1 if launch is None else self._launches.setdefault(launch, len(self._launches))
        node = P2P(
            stream,
            slot,
            bool(is_send),
            int(tag),
            int(nbytes),
            s,
            tuple(deps),
            tuple(after),
            int(conn),
            on,
            nccl_env,
            number,
            pg,
            bool(host),
        )
        return self._add(node)

    def wait(self, refs: Sequence[int], stream: int = 0, deps: Sequence[int] = (), handoff: bool = False) -> int:
        return self._add(Wait(stream, tuple(refs), tuple(deps), handoff))

    def step(self, index: int | None = None, stream: int = 0, deps: Sequence[int] = ()) -> int:
        if index is None:
            index = self._steps.get(stream, 0)
        self._steps[stream] = index + 1
        return self._add(Step(stream, index, tuple(deps)))

    def build(self, source: str = "<builder>") -> tuple[Program, list[tuple[int, ...]]]:
        prog = Program(list(self.nodes))
        prog.check(source)
        return prog, list(self.slot_groups)


def build_graph(
    builders: Sequence[ProgramBuilder], meta: dict | None = None, recorded: dict | None = None
) -> ExecGraph:
    """Rank r's builder is builders[r]; equal programs are stored once."""
    for r, b in enumerate(builders):
        if b.rank != r:
            raise InputError(f"builder {r} is for rank {b.rank}; pass them in rank order", field="ranks")
    graph = assemble([b.build(f"rank {b.rank}") for b in builders], meta, recorded)
    graph.check()
    return graph
