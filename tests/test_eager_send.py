"""A lone send NCCL finishes into its peer's buffer does not hold its stream: two ranks that both send first run.

NCCL's sender kernel waits only for a free slot of its connection's NCCL_STEPS buffer slots, so a send of at most
NCCL_STEPS p2p steps ends before the matching receive starts, and a program whose two ranks both isend, then irecv,
runs (a larger send really does hang, and the coordinator reports the deadlock).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.collectives.nccl.chunking import eager_send_bytes
from phantora.collectives.nccl.settings import settings_of
from phantora.launcher import RunConfig, launch
from phantora.topology.generators import leaf_spine

KIB = 1024


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ((), 8 * 128 * KIB),  # NCCL_STEPS slots of the net / PCI p2p chunk (128 KiB; NVLink's is 512 KiB)
        ((("NCCL_P2P_NET_CHUNKSIZE", "65536"),), 8 * 64 * KIB),
        ((("NCCL_P2P_NET_CHUNKSIZE", "1048576"),), 8 * 512 * KIB),  # then NVLink's chunk is the least
        ((("NCCL_BUFFSIZE", "262144"),), 262144),  # a step never exceeds the Simple buffer over NCCL_STEPS
    ],
)
def test_eager_bytes_are_the_connection_buffer_of_the_least_p2p_step(env: tuple[tuple[str, str], ...], want: int):
    assert eager_send_bytes(settings_of(env)) == want


SEND_FIRST = """
    import sys, torch, torch.distributed as dist
    n = int(sys.argv[1])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    box = torch.zeros(n)
    reqs = [dist.isend(torch.full((n,), float(r + 1)), peer), dist.irecv(box, peer)]  # both ranks send first
    for q in reqs:
        q.wait()
    assert float(box[0]) == peer + 1 and float(box[-1]) == peer + 1, box[:4]
    print("EXCHANGED", flush=True)
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, floats: int):
    script = tmp_path / "send_first.py"
    script.write_text(textwrap.dedent(SEND_FIRST))
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    return launch(RunConfig(str(script), [str(floats)], topology=topo, nproc=2, trace="none", timeout_s=240))


def test_two_ranks_sending_a_small_tensor_first_both_finish(tmp_path: Path):
    rep = _run(tmp_path, 64 * KIB)  # 256 KiB: within the 1 MiB a connection buffers
    assert "EXCHANGED" in rep.logs["rank 0"] and "EXCHANGED" in rep.logs["rank 1"]


def test_two_ranks_sending_past_the_buffer_first_deadlock_as_on_nccl(tmp_path: Path):
    with pytest.raises(BridgeError) as info:
        _run(tmp_path, 1024 * KIB)  # 4 MiB: past the buffer, NCCL's sender waits for the receiver too
    assert str(info.value).startswith("deadlock"), str(info.value)
