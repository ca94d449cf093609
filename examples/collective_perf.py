"""torch.distributed collectives timed as nccl-tests times them, in a plain CUDA + NCCL script: no phantora API.

    phantora run --topology testbed16 --phantom examples/collective_perf.py --ops all_reduce -b 1M -e 1G -f 8
    phantora run --topology dgx8 --gpu h200 --phantom examples/collective_perf.py -b 1M -e 8G -f 8   # one H200 server
    torchrun --nproc_per_node 8 examples/collective_perf.py -b 1M -e 8G -f 8 -d bfloat16      # on a real server

For each size (`-b` to `-e`, times `-f`) and collective, `-w` warm-up calls, then a CUDA event, `-n` calls back to
back, a second event, and the mean call time (nccl-tests' out-of-place loop, with one process per GPU as under
`mpirun -np N ... -g 1`). The size is nccl-tests' size column: all_gather_into_tensor, reduce_scatter_tensor and
all_to_all_single give each rank (size / elsize / ranks) elements, rounded down to a multiple of 16 bytes;
send/recv sends `size` bytes to rank + 1 and receives as many from rank - 1 in one `batch_isend_irecv` group (or
`--p2p pair`: a lone isend and irecv, each its own NCCL call). Rank 0 prints one line per size:
size, count, type, time (us), algbw and busbw (GB/s), with nccl-tests' bus-bandwidth factors.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
DTYPES = {"float": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16, "half": torch.float16}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """nccl-tests' sizes: an integer with an optional K, M or G (powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in UNITS else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise SystemExit(f"collective_perf.py: bad size {text!r} (e.g. 1M, 8G)") from None


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor (src/*.cu `*GetBw`)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def per_rank_count(size: int, elsize: int, n: int) -> int:
    """Elements a rank holds in all_gather, reduce_scatter and all_to_all: nccl-tests' `count / nranks`, with
    the buffer rounded down to a multiple of 16 bytes (common.cu `run`'s alignment of the per-rank size)."""
    return (size // elsize // n) * elsize // 16 * 16 // elsize


def make_call(op: str, size: int, dtype: torch.dtype, p2p: str) -> tuple[Callable[[], None], int, int]:
    """The call of `op` at nccl-tests' `size`, its count column and the bytes of its size column."""
    rank, n = dist.get_rank(), dist.get_world_size()
    el = torch.tensor([], dtype=dtype).element_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = per_rank_count(size, el, n)
        part = torch.empty(count, dtype=dtype, device=dev)
        full = torch.empty(count * n, dtype=dtype, device=dev)
        if op == "all_gather":
            return (lambda: dist.all_gather_into_tensor(full, part)), count, count * n * el
        if op == "reduce_scatter":
            return (lambda: dist.reduce_scatter_tensor(part, full)), count, count * n * el
        out = torch.empty_like(full)
        return (lambda: dist.all_to_all_single(out, full)), count, count * n * el
    count = size // el
    buf = torch.empty(count, dtype=dtype, device=dev)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(buf)), count, count * el
    if op == "broadcast":
        return (lambda: dist.broadcast(buf, src=0)), count, count * el
    recv = torch.empty_like(buf)
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    def sendrecv() -> None:
        if p2p == "batch":
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, nxt), dist.P2POp(dist.irecv, recv, prv)])
        else:
            works = [dist.isend(buf, nxt), dist.irecv(recv, prv)]
        for w in works:
            if w is not None:
                w.wait()

    return sendrecv, count, count * el


def time_op(call: Callable[[], None], warmup: int, iters: int) -> float:
    """Mean microseconds per call over `iters` calls between two CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("-b", "--minbytes", default="1M")
    p.add_argument("-e", "--maxbytes", default="8G")
    p.add_argument("-f", "--stepfactor", type=int, default=8)
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("--p2p", default="batch", choices=("batch", "pair"), help="batch_isend_irecv, or lone isend + irecv")
    args = p.parse_args()
    if args.stepfactor < 2:
        raise SystemExit("collective_perf.py: -f must be 2 or more")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.datatype]
    if rank == 0:
        print(f"# {n} x {torch.cuda.get_device_name()}, {args.datatype}, -n {args.iters} -w {args.warmup_iters}")
        print(f"# {'op':>14} {'size':>12} {'count':>12} {'time us':>10} {'algbw':>8} {'busbw':>8}")
    for op in args.ops:
        for size in sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor):
            call, count, nbytes = make_call(op, size, dtype, args.p2p)
            us = time_op(call, args.warmup_iters, args.iters) if nbytes else 0.0
            algbw = nbytes / us / 1e3 if us else 0.0
            busbw = algbw * busbw_factor(op, n)
            if rank == 0:
                print(f"{op:>16} {nbytes:>12} {count:>12} {us:>10.2f} {algbw:>8.2f} {busbw:>8.2f}", flush=True)
            del call
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
