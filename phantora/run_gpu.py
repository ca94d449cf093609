"""The run's GPU on a loaded topology: `--gpu` replaces the topology's GPU model for every command that takes it.

The GPU model sets NCCL's tuning (its generation: NVLS from Hopper on, the tuning tables) and the compute model;
the topology's links stay the file's. One owner for `phantora run`, `phantora run --jobs` and `phantora
nccl-tests`, so that a live program and nccl-tests on the same file and `--gpu` run the same NCCL.
"""

from __future__ import annotations

import sys
from typing import Any


def apply_gpu(topo: Any, gpu: str | None, prog: str) -> None:
    """Give `topo` the GPU `gpu` (no-op for None) and, where its NVSwitch links differ from that GPU's own NVLink,
    say so in one line on stderr prefixed by `prog`."""
    if gpu is None:
        return
    topo.gpu_model = gpu.strip().lower()
    note = nvlink_note(topo)
    if note:
        print(f"{prog}: note: {note}", file=sys.stderr)


def nvlink_note(topo: Any) -> str | None:
    """Where the topology's GPU model has another NVLink rate than its NVSwitch links: a line saying that the links
    stay the topology's; else None."""
    from phantora.collectives.nccl.platform import nvlink_bps
    from phantora.topology._util import format_rate, nvlink_default

    own = nvlink_default(topo.gpu_model)
    rates = {nvlink_bps(topo, topo.node_of_rank(r)) for r in range(topo.num_ranks)} - {0}
    if own is None or not rates or rates == {own}:
        return None
    kept = "/".join(format_rate(r) for r in sorted(rates))
    return (
        f"--gpu {topo.gpu_model} keeps {topo.name}'s NVLink links of {kept} a direction ({topo.gpu_model}'s own: "
        f"{format_rate(own)}); for the GPU's own host, leave out --topology or write a topology with its rate"
    )
