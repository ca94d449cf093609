"""Probe: torch's object collectives between 2 phantom ranks (tests/test_object_values.py).

Each rank writes what it received to `<out>/objects<rank>.json`. Objects are chosen so that their pickled sizes
differ by rank (the padding to the largest is then visible in the charged bytes).
"""

import json
import sys

import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group()
rank = dist.get_rank()
seen: dict = {}

gathered: list = [None, None]
dist.all_gather_object(gathered, {"rank": rank, "pad": "x" * (100 * (rank + 1))})
seen["all_gather_object"] = gathered

objs: list = [{"plan": [1, 2, 3], "name": "root"}, "second"] if rank == 0 else [None, None]
dist.broadcast_object_list(objs, src=0)
seen["broadcast_object_list"] = objs

at_root: list | None = [None, None] if rank == 1 else None
dist.gather_object(("from", rank), at_root, dst=1)
seen["gather_object"] = at_root

mine: list = [None]
dist.scatter_object_list(mine, [{"to": 0}, {"to": 1, "more": list(range(10))}] if rank == 0 else None, src=0)
seen["scatter_object_list"] = mine

if rank == 0:
    dist.send_object_list([{"stage": 0, "shape": [4, 8]}], dst=1)
else:
    got: list = [None]
    sender = dist.recv_object_list(got, src=0)
    seen["recv_object_list"] = [got, sender]

with open(f"{out}/objects{rank}.json", "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
