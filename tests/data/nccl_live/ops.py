"""Every torch.distributed call that becomes NCCL traffic, one call each, for bench/bench_nccl_live_sweep.py.

    phantora run --topology T tests/data/nccl_live/ops.py all_reduce:4M all_gather:1M@0.1.2.3 ...

Each argument is OP:BYTES[@GROUP][%ENV]: BYTES with K/M/G (powers of 1024), of float32 tensors, as nccl-tests sizes
them (all-gather: the gathered output; reduce-scatter and all-to-all: the whole input; gather / scatter: the root's
whole buffer); GROUP is `.`-joined global ranks of a new_group made for the call (default: the world), or `split:K`
for the K-th of device-mesh-style consecutive blocks (`split_group` on the world, blocks of `PHANTORA_LIVE_BLOCK`
ranks); ENV is `,`-joined NCCL_X=V set in os.environ before the group is created (NCCL reads them then). A rank
outside the call's group skips it. Plain CUDA + NCCL: no phantora API.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def parse(arg: str) -> tuple[str, int, str, dict[str, str]]:
    env: dict[str, str] = {}
    if "%" in arg:
        arg, _, env_text = arg.partition("%")
        env = dict(kv.split("=", 1) for kv in env_text.split(","))
    group = ""
    if "@" in arg:
        arg, _, group = arg.partition("@")
    op, _, size = arg.partition(":")
    return op, parse_bytes(size), group, env


def make_group(spec: str, env: dict[str, str], world: int) -> tuple[dist.ProcessGroup | None, list[int]]:
    os.environ.update(env)
    if spec.startswith("split:"):
        block = int(os.environ.get("PHANTORA_LIVE_BLOCK", "8"))
        k = int(spec.split(":")[1])
        blocks = [list(range(b, b + block)) for b in range(0, world, block)]
        return dist.split_group(split_ranks=blocks), blocks[k]
    if spec:
        ranks = [int(r) for r in spec.split(".")]
        return dist.new_group(ranks), ranks
    return (dist.new_group(list(range(world))) if env else None), list(range(world))


def run(op: str, nbytes: int, group: dist.ProcessGroup | None, ranks: list[int], dev: torch.device) -> None:
    n, me = len(ranks), ranks.index(dist.get_rank())
    count = nbytes // 4

    def t(k: int) -> torch.Tensor:
        return torch.ones(k, device=dev)

    if op == "all_reduce":
        dist.all_reduce(t(count), group=group)
    elif op == "all_reduce_coalesced":  # three tensors in one NCCL group (ProcessGroupNCCL's coalescing)
        with dist._coalescing_manager(group=group, device=dev):
            for k in (count // 2, count // 4, count // 4):
                dist.all_reduce(t(k), group=group)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(t(count), t(count // n), group=group)
    elif op == "all_gather":
        dist.all_gather([t(count // n) for _ in range(n)], t(count // n), group=group)
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(t(count // n), t(count), group=group)
    elif op == "reduce_scatter":
        dist.reduce_scatter(t(count // n), [t(count // n) for _ in range(n)], group=group)
    elif op == "all_to_all_single":
        dist.all_to_all_single(t(count), t(count), group=group)
    elif op == "all_to_all_uneven":  # rank i sends (j + 1) units to rank j: uneven splits
        unit = count // (n * (n + 1) // 2)
        send = [unit * (j + 1) for j in range(n)]
        recv = [unit * (me + 1)] * n
        dist.all_to_all_single(t(sum(recv)), t(sum(send)), recv, send, group=group)
    elif op == "all_to_all":
        dist.all_to_all([t(count // n) for _ in range(n)], [t(count // n) for _ in range(n)], group=group)
    elif op == "broadcast":
        dist.broadcast(t(count), group_src=0, group=group)
    elif op == "reduce":
        dist.reduce(t(count), group_dst=0, group=group)
    elif op == "gather":
        dist.gather(t(count // n), [t(count // n) for _ in range(n)] if me == 0 else None, group_dst=0, group=group)
    elif op == "scatter":
        dist.scatter(t(count // n), [t(count // n) for _ in range(n)] if me == 0 else None, group_src=0, group=group)
    elif op in ("send_recv", "isend_irecv"):  # group rank 0 to the last one
        if me in (0, n - 1):
            peer = n - 1 - me
            if op == "send_recv":
                if me == 0:
                    dist.send(t(count), group_dst=peer, group=group)
                else:
                    dist.recv(t(count), group_src=peer, group=group)
            else:
                if me == 0:
                    w = dist.isend(t(count), group_dst=peer, group=group)
                else:
                    w = dist.irecv(t(count), group_src=peer, group=group)
                w.wait()
    elif op == "batch_isend_irecv":  # a ring: send to the next, receive from the previous, one NCCL group
        nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
        ops = [dist.P2POp(dist.isend, t(count), nxt, group), dist.P2POp(dist.irecv, t(count), prv, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    elif op == "barrier":
        dist.barrier(group=group)
    elif op == "funcol_all_reduce":
        funcol.all_reduce(t(count), "sum", group or dist.group.WORLD).wait()
    elif op == "funcol_all_gather":
        funcol.all_gather_tensor(t(count // n), 0, group or dist.group.WORLD).wait()
    elif op == "funcol_reduce_scatter":
        funcol.reduce_scatter_tensor(t(count), "sum", 0, group or dist.group.WORLD).wait()
    elif op == "funcol_all_to_all":
        funcol.all_to_all_single(t(count), None, None, group or dist.group.WORLD).wait()
    elif op == "dtensor_redistribute":  # Shard(0) -> Replicate() on a 1-D mesh of the world: an all-gather
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard

        mesh = init_device_mesh("cuda", (n,))
        DTensor.from_local(t(count // n), mesh, [Shard(0)]).redistribute(mesh, [Replicate()]).to_local()
    else:
        raise SystemExit(f"ops.py: unknown op {op!r}")


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    split = any("@split:" in a for a in sys.argv[1:])  # split_group needs the default group bound to a device
    dist.init_process_group("nccl", device_id=torch.device("cuda", local) if split else None)
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    for arg in sys.argv[1:]:
        op, nbytes, spec, env = parse(arg)
        group, ranks = make_group(spec, env, world)
        if rank in ranks:
            run(op, nbytes, group, ranks, dev)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
