"""Probe: DCP saves and loads on sub-groups (tests/test_phantom_dcp_groups.py). Plain torch on gloo, 4 processes.

The groups are {0, 2} and {1, 3}, so a rank's rank in its group differs from its global rank (global rank 1 is
rank 0 of its group). Each group saves a tensor holding each member's global rank, with DCP's own
`use_collectives=False` (each rank writes its data and its own metadata, `__{rank in group}.metadata`, and no
global `.metadata`), into a folder of its own. Then phantom mode's DCP patches (phantora/runtime/phantom_dcp.py) are
applied, as a phantom run applies them, and each group loads its folder: a rank must get back its own tensor.
Usage: dcp_subgroups.py FOLDER PORT; each rank writes FOLDER/loaded<rank>.json.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

WORLD = 4


def worker(rank: int, folder: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    # a load that hangs (members planning apart) fails in 60 s instead
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    mine, path = groups[rank % 2], os.path.join(folder, f"group{rank % 2}")
    dcp.save({"x": torch.full((4,), float(rank))}, checkpoint_id=path, process_group=mine, use_collectives=False)
    dist.barrier()

    from phantora.runtime import phantom_dcp

    phantom_dcp._patch(dcp)
    state = {"x": torch.zeros(4)}
    dcp.load(state, checkpoint_id=path, process_group=mine)
    with open(os.path.join(folder, f"loaded{rank}.json"), "w") as f:
        json.dump({"rank_in_group": dist.get_rank(mine), "x": state["x"].tolist()}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD)
