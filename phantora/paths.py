"""Where the project's companion data lives: the `shared/` folder beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """`$PHANTORA_SHARED`, else `shared/` beside the repository, else /work/shared."""
    env = os.environ.get("PHANTORA_SHARED")
    if env:
        return Path(env)
    beside = REPO_ROOT.parent / "shared"
    return beside if beside.is_dir() else Path("/work/shared")
