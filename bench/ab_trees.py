"""Side-by-side benchmarks of two source trees: a git revision exported beside this checkout, run alternately."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_revision(rev: str, dest: Path) -> Path:
    """The tree of git revision `rev` of this checkout, extracted into `dest` (created)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    if (dest / "phantora" / "runtime" / "simcuda" / "_fastop.c").is_file():  # its compiled per-op path, as setup.sh
        build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
        if subprocess.run(build, cwd=dest, capture_output=True).returncode != 0:
            print(f"warning: the compiled per-op path of {rev} did not build: it runs the Python one", file=sys.stderr)
    return dest


def alternately(rev: str, base: Path, launches: int, run: Callable[[Path], list[float]]) -> dict[str, list[float]]:
    """`run(tree)` for revision `rev` (exported at `base`) and this tree, one after the other, `launches` times:
    the samples of each, keyed "before (rev)" and "after (this tree)" (alternating spreads the load's drift)."""
    trees = {f"before ({rev})": export_revision(rev, base), "after (this tree)": ROOT}
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(launches):
        for name, tree in trees.items():
            samples[name] += run(tree)
    return samples
