"""A PXN-relayed lone send's successor on its connection waits until the relay has sent it on (bridge/core.py
`_received_with`, the gate of bridge/stream_order.py and runtime/session.py `handoff_at`).

Under eager init (`init_process_group(device_id=...)`) a lone send runs on its group's communicator, so a send from
GPU 1 of host 0 to GPU 0 of host 1 of a 2 x 2 rail fabric is relayed by rank 0 (its GPU is on the receiver's rail):
the sender's kernel writes its steps over NVLink into the relay's proxy buffer and the relay's proxy sends them on.
Across hosts the proxy runs one send op a channel at a time (proxy.cc `ProxyAppend` chains the next op behind it;
net.cc `sendProxyProgress` posts the next op's slots only as its own isends complete), so a second such send hands
off only once the first has crossed the network, not once it has landed in the relay's buffer. Closed forms
(tests/test_handoff_transports.py): a 256 KiB send between two hosts hands off 8.4 + 1.0 us + 262,144 B at
20.6 GB/s = 22,125 ns after its kernel starts; over 25 Gbit/s NICs its transfer takes far longer.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.launcher import RunConfig, launch
from phantora.topology import rail_optimized

HANDOFF = 22_125  # ns: a 256 KiB send's hand-off between two hosts
SENDS = """
    import sys, torch, torch.distributed as dist
    n = int(sys.argv[1])
    dist.init_process_group(device_id=torch.device("cuda", 0))  # eager init: the world's communicator
    r = dist.get_rank()
    x, y = (torch.ones(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    if r in (1, 2):  # 1: host 0 rail 1 -> 2: host 1 rail 0, relayed by rank 0 (host 0 rail 0)
        op = (lambda t: dist.send(t, 2)) if r == 1 else (lambda t: dist.recv(t, 1))
        ev[0].record()
        op(x)
        ev[1].record()
        op(y)
        ev[2].record()
        print("TIMES", *[e.t_ns for e in ev], flush=True)
    dist.destroy_process_group()
"""


def _times(log: str) -> list[int]:
    return [int(v) for v in next(x for x in log.splitlines() if x.startswith("TIMES")).split()[1:]]


def test_a_relayed_send_hands_off_once_the_send_before_it_has_crossed_the_network(tmp_path: Path) -> None:
    """Rank 1 sends 256 KiB twice to rank 2, which receives both. The first hands off at once (22,125 ns after its
    start); the second needs the first's proxy op done, which is when the first has arrived at rank 2 (its receive's
    end) and the write's ACK is back (the path's propagation from rank 2 to rank 1, `Slots.back_ns`), then hands
    off 22,125 ns later. Before, it waited only for the first's last NVLink step into the relay's
    buffer (done long before), and handed off 22,125 ns after the first. The recorded graph replays to the live
    run's ends (egraph replay gates on the receiver's last flows)."""
    from phantora.egraph import replay_graph
    from phantora.egraph.live import record_run
    from phantora.netsim.flow import FlowSimulator

    script = tmp_path / "sends.py"
    script.write_text(textwrap.dedent(SENDS))
    topo = rail_optimized(2, 2, spines=2, nic_rate=25 * 10**9, gpu="h100")
    cfg = RunConfig(str(script), [str(256 * 1024)], topology=topo, nproc=4, trace="none", timeout_s=240)
    cfg.tensors = "phantom"
    cfg.out_dir = str(tmp_path / "run")
    rep, graph = record_run(cfg, tmp_path / "g")
    s0, s1, s2 = _times(rep.logs["rank 1"])
    _, received, _ = _times(rep.logs["rank 2"])
    assert s1 - s0 <= HANDOFF + 2_000  # the first: its kernel (after the host's launch of it)
    assert received > s1 + HANDOFF  # the network is far slower than the hand-off
    back = topo.path_latency_ns(topo.route(topo.node_of_rank(2), topo.node_of_rank(1)))
    assert back > 1_000  # across the network
    assert s2 == received + back + HANDOFF
    res = replay_graph(graph, topo, FlowSimulator(topo))
    assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)


def test_a_program_whose_ranks_differ_under_deduplication_is_told_to_turn_it_off(tmp_path: Path) -> None:
    """The same program with 2 live processes for its 4 ranks: rank 2 runs as live rank 0, which sends nothing, so
    rank 1's send has no receiver; the error names rank deduplication and `--dedup off`."""
    script = tmp_path / "sends.py"
    script.write_text(textwrap.dedent(SENDS))
    topo = rail_optimized(2, 2, spines=2, nic_rate=25 * 10**9, gpu="h100")
    cfg = RunConfig(str(script), [str(256 * 1024)], topology=topo, nproc=4, trace="none", timeout_s=240)
    cfg.tensors, cfg.dedup = "phantom", "2"
    with pytest.raises(PhantoraError) as err:
        launch(cfg)
    text = str(err.value)
    assert "missing participant" in text and "2 live processes run the 4 ranks' program" in text, text
    assert "--dedup off" in text
