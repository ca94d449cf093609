"""CPU time a host op costs phantora with the host compute model on and off (runtime/hostwork.py).

    .venv/bin/python bench/bench_host_ops.py [--ops 20000] [--reps 4]

`--ops` in-place adds of two 64-element CPU tensors under a rank's ChargeMode after the program has made a cuda tensor
(so they are host ops), with the session's host model off (`host` None: run as plain torch) and on (each timed on a
DGX H100 host), alternately `--reps` times each in one process: CPU µs per op.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.hosts import get_host
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.hostwork import HostModel
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import device


def per_op_us(on: bool, ops: int) -> float:
    """CPU µs per host add with the host model `on` or off."""
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    if on:
        s.host = HostModel(get_host("dgx-h100"), 8, get_gpu("h100").host_bw, 1)
    a, b = torch.ones(64), torch.ones(64)
    with ChargeMode(s):
        torch.ops.aten.full.default([4], 1.0, device=torch.device("cuda", 0))  # the program uses the GPU
        start = time.process_time()
        for _ in range(ops):
            a.add_(b)
        return (time.process_time() - start) / ops * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--reps", type=int, default=4)
    args = p.parse_args()
    device._installed = True  # what simcuda.install sets in a rank
    got: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.reps):
        for on in (False, True):
            got[on].append(per_op_us(on, args.ops))
    for on in (False, True):
        print(f"host model {'on ' if on else 'off'}: {' '.join(f'{x:.2f}' for x in got[on])} CPU us a host op")


if __name__ == "__main__":
    main()
