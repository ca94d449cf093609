"""The decomposed driver's joins (issue 38): the gates of flows sharing a wide deps list wait on one join of it.

No ns-3: a fake pool whose workers end each flow `END_NS` after it is posted (its `at`, or its gate's ns), so every
completion has a closed form: the second batch's flows are posted at the latest end of the wide list they all wait
on, + their own delay.
"""

from __future__ import annotations

from typing import Any

from phantora.netsim.base import Completion, Flow
from phantora.netsim.decompose import DecomposedSimulator, RoundReply
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, gpu, tiny

END_NS = 5_000


class _Pool:
    """Workers without ns-3: a flow ends END_NS after its post (a gated one after its gate's ns, if later)."""

    def __init__(self, _topo: Any, _config: Any, assignment: list[list[int]], *_: Any) -> None:
        self.workers = [type("H", (), {"index": i, "pid": 0, "pieces": p})() for i, p in enumerate(assignment)]
        self.curve = False
        self.ends: list[dict[int, tuple[Flow, int]]] = [{} for _ in assignment]
        self.waiting: list[dict[int, tuple[Flow, int]]] = [{} for _ in assignment]

    def round(self, posts: dict[int, Any]) -> Any:
        replies = []
        for i, (_, out, until) in posts.items():
            gated = set(out.gated)
            for (f, _), at in zip(out.flows, out.at, strict=True):
                (self.waiting[i] if f.id in gated else self.ends[i])[f.id] = (f, at + f.delay_ns + END_NS)
            for fid, p in out.gates:
                f, end = self.waiting[i].pop(fid)
                self.ends[i][fid] = (f, max(end, p + f.delay_ns + END_NS))
            done = [Completion(fid, e - END_NS, e, f.size, f.src, f.dst) for fid, (f, e) in self.ends[i].items()]
            done = sorted((c for c in done if c.end_ns <= until), key=lambda c: (c.end_ns, c.flow_id))
            for c in done:
                del self.ends[i][c.flow_id]
            left = self.ends[i].values()
            nxt = min((e for _, e in left), default=None)
            replies.append((i, RoundReply(done, [], 0.0, 0.0, until, nxt, len(left) + len(self.waiting[i]))))
        return iter(replies)

    def keepalive(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_gates_sharing_a_wide_deps_list_open_at_its_latest_end_through_one_join() -> None:
    topo = tiny()
    # 20 flows on rail 0, staggered by their delays; then 3 flows on rail 1 that each wait on all 20 (a wide list)
    first = [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096, delay_ns=100 * i) for i in range(20)]
    deps = tuple(range(20))
    second = [Flow(100 + k, gpu(topo, k, 1), gpu(topo, (k + 1) % 3, 1), 4096, deps, delay_ns=7 * k) for k in range(3)]
    pool: Any = _Pool
    sim = DecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)  # type: ignore[arg-type]
    sim.submit([*first, *second], 0)
    assert sim._owner[0] != sim._owner[100]  # (every second-batch flow waits on another worker's flows)
    assert sim._rel.held() == 3 + 1  # three gates and one join, not three gates on 20 deps each
    done = {c.flow_id: c for c in sim.drain()}
    last = 100 * 19 + END_NS  # the latest end of the wide list
    assert {f.id: done[f.id].end_ns for f in first} == {i: 100 * i + END_NS for i in range(20)}
    assert {f.id: done[f.id].end_ns for f in second} == {100 + k: last + 7 * k + END_NS for k in range(3)}
    assert sim._rel.held() == 0 and sim.in_flight() == 0
