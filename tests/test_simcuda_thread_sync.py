"""A CUDA synchronise from a thread other than the program's does not talk to the coordinator.

DCP's `async_save` (torchtitan's `--checkpoint.async_mode async`) writes the checkpoint in a background thread, and
its file writer synchronises its CUDA stream there (`filesystem.py`, `_OverlappingCpuLoader._finish`). That
synchronise joined the rank's collectives in flight from the background thread, so while the program's thread
waited on a collective too, the rank sent the coordinator a second wait and the run stopped ("rank 0 sent 'wait'
while blocked in wait"; docs/runtime.md, user trials). A background thread's host time is not simulated (its GPU
ops run on its stream's lane, dispatch.py); its synchronise now waits for nothing, and only the program's thread
joins the collectives.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = """
    import sys, threading, time, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    x = torch.ones(1 << 16, device="cuda")
    if me == 1:
        time.sleep(2)  # rank 0's two threads are both blocked by then, each in its own sync
    work = dist.all_reduce(x, async_op=True)
    side = threading.Thread(target=torch.cuda.synchronize)
    side.start()
    work.wait()
    torch.cuda.synchronize()
    side.join()
    model = torch.nn.Linear(64, 64).cuda()
    pg = dist.new_group(backend="gloo")  # torchtitan's group for its async checkpoints
    saved = dcp.async_save({"model": model.state_dict()}, checkpoint_id=sys.argv[1], process_group=pg)
    for _ in range(20):
        dist.all_reduce(x)
        torch.cuda.synchronize()
    saved.result()
    print("DONE", me, x[0].item(), flush=True)
    dist.destroy_process_group()
"""


def test_a_background_threads_synchronise_leaves_the_coordinator_to_the_program(tmp_path: Path) -> None:
    script = tmp_path / "sync.py"
    script.write_text(textwrap.dedent(SCRIPT))
    ck = tmp_path / "ck"
    rep = launch(RunConfig(str(script), [str(ck)], "testbed16", nproc=2, trace="none", timeout_s=120))
    for r in range(2):
        assert f"DONE {r} {2.0**21}" in rep.logs[f"rank {r}"]  # 21 all-reduces of ones on 2 ranks
    assert (ck / ".metadata").is_file() and len(list(ck.glob("*.distcp"))) == 2
