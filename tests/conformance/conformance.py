"""Running a vendored upstream program, unchanged, under `phantora run`, as a user would (the CLI, in its own
working directory), and reading what the run reports."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
TIMEOUT_S = 900
DOC = HERE.parents[1] / "docs" / "runtime.md"  # its conformance tables quote each case's step time
_CELL = re.compile(r"(?<!\\)\|")  # a table cell border (not an escaped `\|` inside a cell)


@dataclass
class Run:
    """One finished `phantora run` of a program."""

    returncode: int
    output: str  # the CLI's stdout and stderr
    workdir: Path  # the program's working directory (what it wrote: checkpoints, snapshots)
    out: Path  # phantora's run directory

    def results(self) -> dict[str, Any]:
        return json.loads((self.out / "results.json").read_text())

    def log(self, rank: int = 0) -> str:
        return (self.out / "logs" / f"rank{rank}.log").read_text()

    def steps(self) -> list[dict[str, Any]]:
        return list(self.results()["steps"])

    def step_ms(self) -> float:
        """The steady step time in simulated ms (the mean after step 0), asserted finite and positive."""
        ms = self.results()["step_time_ns"]["mean"] / 1e6
        assert math.isfinite(ms) and ms > 0, ms
        return float(ms)

    def kernels(self, rank: int = 0) -> list[str]:
        """The names of the compute kernels `rank` ran, in order (trace.json)."""
        events = json.loads((self.out / "trace.json").read_text())["traceEvents"]
        return [e["name"] for e in events if e.get("cat") == "compute" and e.get("pid") == rank]


def documented_step(program: str, configuration: str) -> str:
    """The step time docs/runtime.md's conformance tables quote for `program` in the one row whose configuration
    cell starts with `configuration`: the first "N.NNN ms" of its "step time" cell, as written."""
    rows, header = [], []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in _CELL.split(line)[1:-1]]
        if not header:
            header = cells
        elif cells[0] == f"`{program}`" and cells[1].startswith(configuration) and "step time" in header:
            rows.append(cells[header.index("step time")])
    assert len(rows) == 1, f"{DOC}: {len(rows)} conformance rows for {program} starting {configuration!r}"
    quoted = re.match(r"(\d+\.\d+) ms", rows[0])
    assert quoted, f"{DOC}: the step time of {program} ({configuration!r}) is {rows[0]!r}, not N.NNN ms"
    return quoted.group(1)


def assert_documented(ms: float, program: str, configuration: str) -> None:
    """The simulated step time `ms` is the one docs/runtime.md quotes for the case, to the digits it quotes
    (simulated time is deterministic, so a quoted figure that differs is stale: re-measure the row)."""
    quoted = documented_step(program, configuration)
    measured = f"{ms:.{len(quoted.split('.')[1])}f}"
    assert measured == quoted, f"docs/runtime.md quotes {quoted} ms for {program} ({configuration}); it ran {measured}"


def workdir_for(upstream: str, folder: str, into: Path) -> Path:
    """A fresh copy of the program's folder (`programs/<upstream>/<folder>`) to run it in."""
    dest = into / "work"
    shutil.copytree(PROGRAMS / upstream / folder, dest)
    return dest


def run_program(
    workdir: Path,
    script: str,
    args: list[str],
    out: Path,
    nproc: int = 4,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Run:
    """`phantora run --topology testbed16 --nproc N [options] <script> <args>` in `workdir`, in the environment of
    an activated virtual environment (its `bin` first on PATH, as programs that run `python3` expect), plus `env`."""
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--nproc", str(nproc), *options]
    cmd += ["--out", str(out), "--no-progress", script, *args]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    environ = {**os.environ, "PATH": path, **(env or {})}
    proc = subprocess.run(cmd, cwd=workdir, env=environ, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Run(proc.returncode, proc.stdout + proc.stderr, workdir, out)


def git_blob_id(path: Path) -> str:
    """`git hash-object path`: the id git gives the file's content."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def assert_manifest_tree(upstream: str) -> None:
    """The vendored tree `programs/<upstream>` holds exactly the files its manifest names (`<upstream>.blobs`), each
    the upstream file (its git blob id); the dataset helpers a run builds are left aside."""
    blobs = manifest_blobs(upstream)
    root = PROGRAMS / upstream
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    present = {p for p in present if not p.startswith("megatron/core/datasets/helpers_cpp")}  # built by a run
    assert present == set(blobs) and "LICENSE" in blobs and "pretrain_gpt.py" in blobs
    for path, blob in blobs.items():
        assert git_blob_id(root / path) == blob, path


def manifest_blobs(name: str) -> dict[str, str]:
    """{path: git blob id} from the manifest `<name>.blobs` beside this file (lines `path blob`, # comments)."""
    lines = (HERE / f"{name}.blobs").read_text().splitlines()
    return dict(line.split() for line in lines if line and not line.startswith("#"))


def provenance_blobs(upstream: str) -> dict[str, str]:
    """{path: git blob id} from the PROVENANCE.md table of `upstream`'s section."""
    text = (HERE / "PROVENANCE.md").read_text()
    section = text.split(f"## {upstream}", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{40})` \|$", section, flags=re.M))
