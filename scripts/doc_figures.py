"""Quoted command output in the docs, checked against the command (simulated figures are deterministic).

A marked block is an HTML comment line naming the command, directly followed by a fenced block that quotes its
output:

    <!-- output-of: .venv/bin/phantora topo rail128 -->
    ```
    topology rail128  (16 x DGX-H100, ...)
    ...
    ```

`output-of[slow]:` marks a command that takes more than a few seconds (the test then needs `-m slow`).
`output-of[needs=reference-runs]:` (or `[slow, needs=reference-runs]`) names a folder of the shared data
(`phantora.paths.shared_dir()`, `$PHANTORA_SHARED`) that the command reads: where it is absent, as on a fresh
clone, the block is skipped, not failed. The
command runs with bash from the repository root. Every line of the quoted block must be a line of the command's
output (stdout and stderr), in order, after trailing spaces are dropped; a line `...` skips any number of output
lines, and a quoted line ending in ` ...` only has to start the output line (for wall times and long comments).
Extra output lines between two quoted lines are allowed: a quote may leave rows out.

    .venv/bin/python scripts/doc_figures.py --list             # the marked blocks
    .venv/bin/python scripts/doc_figures.py --check [--slow]   # run them and report every mismatch
    .venv/bin/python scripts/doc_figures.py --show docs/tutorial.md:42   # a block's fresh output, to paste

Wall times are not simulated figures: quote them as indications with the date and the machine, outside marked
lines (or as ` ...` prefixes).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*output-of(?:\[([^\]]*)\])?:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One marked block: where it is, the command, whether it is slow, the quoted lines."""

    path: Path
    line: int  # 1-based line of the marker
    command: str
    slow: bool
    quoted: tuple[str, ...]
    needs: str | None = None  # a folder of the shared data the command reads (skipped where absent)

    @property
    def where(self) -> str:
        """`file:line` relative to the repository root."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def missing(self) -> str | None:
        """The shared-data folder the block needs and this machine lacks, if any."""
        if self.needs is None:
            return None
        sys.path.insert(0, str(ROOT))
        from phantora.paths import shared_dir

        folder = shared_dir() / self.needs
        return None if folder.is_dir() else str(folder)


def doc_files() -> list[Path]:
    """README.md and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The marked blocks of one markdown file (a marker not followed by a fenced block is an error)."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    for i, raw in enumerate(lines):
        m = MARKER.match(raw.strip())
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].lstrip().startswith("```"):
            raise ValueError(f"{path.name}:{i + 1}: an output-of marker must be followed by a fenced block")
        body: list[str] = []
        for j in range(i + 2, len(lines)):
            if lines[j].lstrip().startswith("```"):
                break
            body.append(lines[j].rstrip())
        else:
            raise ValueError(f"{path.name}:{i + 1}: unterminated fenced block")
        slow, needs = _options(path, i + 1, m.group(1) or "")
        out.append(Block(path, i + 1, m.group(2), slow, tuple(body), needs))
    return out


def _options(path: Path, line: int, text: str) -> tuple[bool, str | None]:
    """The bracketed options of a marker: `slow` and `needs=FOLDER`, comma-separated."""
    slow, needs = False, None
    for opt in (o.strip() for o in text.split(",") if o.strip()):
        if opt == "slow":
            slow = True
        elif opt.startswith("needs="):
            needs = opt.removeprefix("needs=").strip()
        else:
            raise ValueError(f"{path.name}:{line}: unknown output-of option {opt!r} (slow, needs=FOLDER)")
    return slow, needs


def all_blocks() -> list[Block]:
    """Every marked block of README.md and docs/*.md."""
    return [b for p in doc_files() for b in blocks(p)]


def _matches(quoted: str, actual: str) -> bool:
    """A quoted line matches an output line exactly, or as a prefix when it ends in ' ...'."""
    if quoted.endswith(" ..."):
        return actual.startswith(quoted[:-4].rstrip())
    return actual == quoted


def mismatches(quoted: tuple[str, ...] | list[str], output: str) -> list[str]:
    """What of the quote the output does not contain, in order (empty: the quote holds)."""
    actual = [line.rstrip() for line in output.splitlines()]
    problems: list[str] = []
    pos = 0
    for q in quoted:
        if not q.strip() or q.strip() == "...":
            continue
        k = next((j for j in range(pos, len(actual)) if _matches(q, actual[j])), None)
        if k is None:
            near = _nearest(q, actual[pos:])
            problems.append(f"quoted: {q}\n  output: {near}" if near else f"quoted: {q}\n  output: (no such line)")
            continue
        pos = k + 1
    return problems


def _nearest(quoted: str, candidates: list[str]) -> str | None:
    """The output line that shares the longest start with the quoted line (to show what changed)."""
    best, score = None, 0
    for line in candidates:
        n = 0
        for a, b in zip(quoted, line, strict=False):
            if a != b:
                break
            n += 1
        if n > score:
            best, score = line, n
    return best if score >= 4 else None


def run(block: Block, timeout: float | None = None) -> str:
    """The command's stdout and stderr, run with bash from the repository root (a failure raises)."""
    proc = subprocess.run(
        ["bash", "-c", block.command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{block.where}: `{block.command}` exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    """--list, --check or --show the marked blocks."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the marked blocks")
    ap.add_argument("--check", action="store_true", help="run the blocks' commands and compare")
    ap.add_argument("--slow", action="store_true", help="with --check: also the [slow] blocks")
    ap.add_argument("--show", metavar="FILE:LINE", help="run one block's command and print its output")
    args = ap.parse_args(argv)
    found = all_blocks()
    if args.show:
        pick = [b for b in found if b.where == args.show]
        if not pick:
            ap.error(f"no marked block at {args.show} (see --list)")
        print(run(pick[0]), end="")
        return 0
    if args.list or not args.check:
        for b in found:
            print(f"{b.where:32} {'slow' if b.slow else 'fast'}  {b.command}")
        return 0
    failed = 0
    for b in found:
        if b.slow and not args.slow:
            continue
        if b.missing():
            print(f"{b.where}: skipped ({b.missing()} absent)")
            continue
        problems = mismatches(b.quoted, run(b))
        print(f"{b.where}: {'ok' if not problems else f'{len(problems)} line(s) differ'}")
        for p in problems:
            print("  " + p)
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
