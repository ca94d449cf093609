"""Where `phantora nccl-tests --granularity chunked` differs or differed from coarse flows (NCCL's time): the cases
docs/nccl-tests.md lists. A tree forced inside one node under LL128 forwards its chunks in sweeps of lines (close to
coarse); under Simple its chunks cross each NVLink hop whole, its two halves sharing their channel's rate (as
`pipeline.py`'s fill moves them); a broadcast's chunked chain pays its own fill (a 512 KiB step forwarded whole at
each of n - 1 hops, as NCCL's kernel does), which NCCL's model has not. A send/recv across hosts, PAT's rounds and a
chain's hops keep NCCL_STEPS steps in flight on a connection (p2p and PAT close to coarse), and so does a ring's
hop, its steps on the wire one at a time (close to coarse; before, side by side, they took unequal shares of a
spine link). NVLS runs NCCL's loops (whole chunks, the last loop's chunk aligned by version) and NVLS-Tree each
loop's NVLS reduce, tree and multicast in turn, the reduce behind a free slot of the tree connection (both close
to coarse at 100 MB, 10^8 bytes: not a whole number of loops).

Each case runs `phantora nccl-tests` twice on the flow network, coarse then chunked, and prints the out-of-place
time of each and the chunked run's excess. Simulated figures, deterministic; a few seconds a run.

    .venv/bin/python bench/bench_chunked_gaps.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHANTORA = str(ROOT / ".venv" / "bin" / "phantora")


@dataclass(frozen=True)
class Case:
    """One call of nccl-tests: what it shows, the test, its size, the NCCL_* variables and the topology."""

    what: str
    test: str
    size: str
    env: tuple[tuple[str, str], ...] = ()
    topology: str | None = None  # None: nccl-tests' default, one 8-GPU H100 server


TREE = ("NCCL_ALGO", "Tree")
CASES = (
    Case("tree forced inside one node, LL128", "all_reduce_perf", "4M", (TREE, ("NCCL_PROTO", "LL128"))),
    Case(
        "tree forced inside one node, Simple",
        "all_reduce_perf",
        "64M",
        (TREE, ("NCCL_PROTO", "Simple")),
    ),
    Case("broadcast chain, 2 hosts x 8 (testbed16)", "broadcast_perf", "16M", (), "testbed16"),
    Case("broadcast chain, one host of 8", "broadcast_perf", "16M"),
    Case("send/recv, 2 hosts x 8 (testbed16)", "sendrecv_perf", "16M", (), "testbed16"),
    Case("PAT all-gather, 8 hosts x 1 (star8)", "all_gather_perf", "16M", (("NCCL_ALGO", "PAT"),), "star8"),
    Case("PAT reduce-scatter, 8 hosts x 1 (star8)", "reduce_scatter_perf", "16M", (("NCCL_ALGO", "PAT"),), "star8"),
    Case(
        "ring, 2 hosts x 8 (testbed16), Simple",
        "all_reduce_perf",
        "256M",
        (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple")),
        "testbed16",
    ),
    Case("NVLS, one host of 8", "all_reduce_perf", "100000000", (("NCCL_ALGO", "NVLS"),)),
    Case(
        "NVLS-Tree, 2 hosts x 8 (testbed16)", "all_reduce_perf", "100000000", (("NCCL_ALGO", "NVLSTree"),), "testbed16"
    ),
)


def time_us(case: Case, granularity: str) -> float:
    """The out-of-place time (µs) `phantora nccl-tests` prints for the case's one size."""
    cmd = [PHANTORA, "nccl-tests", case.test, "-b", case.size, "-e", case.size, "--granularity", granularity]
    cmd += ["--topology", case.topology] if case.topology else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")} | dict(case.env)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.strip() and not line.startswith("#"))
    return float(row.split()[5])


def main() -> int:
    print(f"{'case':<42} {'size':>9} {'coarse us':>10} {'chunked us':>11} {'chunked/coarse':>15}")
    for case in CASES:
        coarse, chunked = time_us(case, "coarse"), time_us(case, "chunked")
        print(f"{case.what:<42} {case.size:>9} {coarse:10.2f} {chunked:11.2f} {chunked / coarse - 1:+15.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
