"""Replay ranks for a bridge test's `CosimRun`: `python -m phantora.egraph.replay_rank WORKLOAD`, forked.

A fresh replay rank spends 0.2 CPU s importing phantora's workload and collective models before it reads its
workload, and a bridged replay runs 8-16 of them. Named as their fork server's preload, they are forked from the
session's zygote (tests/conftest.py) with those modules imported once: the same processes but for their start,
which these tests do not check (an 8-rank replay of one all-reduce, 4 runs: 15.0 -> 6.8 CPU s, the same times)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MODULE = "phantora.egraph.replay_rank"


def replay_ranks(workload: str | Path, *args: str) -> dict[str, Any]:
    """`CosimRun` keywords: each rank replays `workload` (with replay_rank's `args`), forked from a fork server that
    imported the module."""
    return {"rank_cmd": [sys.executable, "-m", MODULE, str(workload), *args], "rank_preload": (MODULE,)}
