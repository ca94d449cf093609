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
clone, the block is skipped, not failed. `[timeout=900]` gives a fast block's command more than the suite's
300 s per test (a few CPU seconds in several processes, which a loaded shared machine stretches). The
command runs with bash from the repository root. Every line of the quoted block must be a line of the command's
output (stdout and stderr), in order, after trailing spaces are dropped; a line `...` skips any number of output
lines, and a quoted line ending in ` ...` only has to start the output line (for wall times and long comments).
Extra output lines between two quoted lines are allowed: a quote may leave rows out.

    .venv/bin/python scripts/doc_figures.py --list             # the marked blocks
    .venv/bin/python scripts/doc_figures.py --check [--slow]   # run them and report every mismatch
    .venv/bin/python scripts/doc_figures.py --show docs/tutorial.md:42   # a block's fresh output, to paste
    .venv/bin/python scripts/doc_figures.py --regenerate docs/validation.md:212   # rewrite a generated block
    .venv/bin/python scripts/doc_figures.py --unchecked docs/packet-model.md   # prose figures to look at
    .venv/bin/python scripts/doc_figures.py --save runs/figs docs/status.md docs/tutorial.md:94   # run, keep

`--save DIR [IDS...]` runs each named block (`FILE:LINE`), or every [slow] block of a named doc (`FILE`; no
IDS: of every doc), once, and keeps what it printed in `DIR/<id>.out` and how it compares in `DIR/<id>.json`
(id, ok, problems, err, seconds; `<id>` is the `FILE:LINE` with `/` and `:` as `_`), printing OK, STALE (the
quote differs), ERR (the command failed) or SKIP (its shared data is absent) per block: a stale block is then
re-quoted from the saved output without running its command again.

A generated block is markdown the command prints, kept rendered (tables, lists), between two comment lines:

    <!-- generated[slow]: .venv/bin/python bench/bench_nccl_tests.py --markdown -->
    ...the command's output, verbatim...
    <!-- end of generated block -->

It is checked whole (every line, in order, blank lines at its ends aside), and `--regenerate FILE:LINE` writes
the command's fresh output into it.

Prose that quotes figures (a paragraph or a list explaining a table) is checked as a figures block:

    <!-- figures-from[slow]: .venv/bin/phantora compare runs/a runs/b -->
    DCTCP's makespan is 2.7 % shorter, bucket.1 takes 180.14 µs ...
    <!-- end of figures -->

Every figure with a unit in the lines between the two markers (outside fenced blocks, which their own markers
check, and outside dated lines) must be a number the command prints: the same digits, thousands separators
aside, so "7,916 marks" holds against "7916". Figures in code spans (each on one line) are settings or inputs,
not results, and are left alone (`Kmin = 4 KB per Gb/s`). A derived figure (a ratio, a difference) is checked by
a command that prints it, such as `phantora compare`.

Wall times are not simulated figures: quote them as indications with the date and the machine, outside marked
lines (or as ` ...` prefixes).

A table whose figures a test checks elsewhere (a slow run's own assertions) says which columns, in a comment line
directly above it; `--unchecked` then leaves those columns alone:

    <!-- columns checked: step time (tests/conformance: assert_documented); wall: an indication, 2026-11-29 -->

Figures that are not simulated (a data sheet's peak, a published measurement the model is compared with, a
configuration input) are said to be so, with their source, so that `--unchecked` leaves them alone: a table's
columns by a comment line directly above it, `<!-- columns not simulated: published (the paper's Table 1) -->`,
and prose between `<!-- not simulated: SOURCE -->` and `<!-- end of not simulated -->` (no simulated figure
belongs there: a line that quotes both kinds goes in a figures block, or quotes the published one in a code span).
A paragraph of simulated figures from one day's run that no test re-runs (an audit of many minutes) is dated
whole, as a dated line is: `<!-- dated 2026-11-29: bench_nccl_packet.py, 13 min -->` ... `<!-- end of dated -->`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*output-of(?:\[([^\]]*)\])?:\s*(.+?)\s*-->\s*$")
GENERATED = re.compile(r"^<!--\s*generated(?:\[([^\]]*)\])?:\s*(.+?)\s*-->\s*$")
END_GENERATED = "<!-- end of generated block -->"
PROSE = re.compile(r"^<!--\s*figures-from(?:\[([^\]]*)\])?:\s*(.+?)\s*-->\s*$")
END_PROSE = "<!-- end of figures -->"


@dataclass(frozen=True)
class Block:
    """One marked block: where it is, the command, whether it is slow, the quoted lines."""

    path: Path
    line: int  # 1-based line of the marker
    command: str
    slow: bool
    quoted: tuple[str, ...]
    needs: str | None = None  # a folder of the shared data the command reads (skipped where absent)
    timeout_s: float | None = None  # its test's time limit, where the suite's default is not enough
    end: int = 0  # a generated or figures block: 1-based line of its end marker (0: an output-of block)
    prose: bool = False  # a figures block: its lines' figures must be numbers of the output

    @property
    def where(self) -> str:
        """`file:line` relative to the repository root (a file elsewhere: as given)."""
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

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
        slow, needs, timeout_s = _options(path, i + 1, m.group(1) or "")
        out.append(Block(path, i + 1, m.group(2), slow, tuple(body), needs, timeout_s))
    return out


def _options(path: Path, line: int, text: str) -> tuple[bool, str | None, float | None]:
    """The bracketed options of a marker: `slow`, `needs=FOLDER` and `timeout=SECONDS`, comma-separated."""
    slow, needs, timeout_s = False, None, None
    for opt in (o.strip() for o in text.split(",") if o.strip()):
        if opt == "slow":
            slow = True
        elif opt.startswith("needs="):
            needs = opt.removeprefix("needs=").strip()
        elif opt.startswith("timeout="):
            value = opt.removeprefix("timeout=").strip()
            if not value.isdigit() or int(value) <= 0:
                raise ValueError(f"{path.name}:{line}: timeout={value!r}: a whole number of seconds > 0")
            timeout_s = float(value)
        else:
            raise ValueError(
                f"{path.name}:{line}: unknown output-of option {opt!r} (slow, needs=FOLDER, timeout=SECONDS)"
            )
    return slow, needs, timeout_s


def generated_blocks(path: Path) -> list[Block]:
    """The generated blocks of one markdown file: the lines between the marker and its end marker."""
    return _spans(path, GENERATED, END_GENERATED, prose=False)


def figures_blocks(path: Path) -> list[Block]:
    """The figures blocks of one markdown file: the prose between the marker and its end marker."""
    return _spans(path, PROSE, END_PROSE, prose=True)


def _spans(path: Path, marker: re.Pattern[str], end_line: str, prose: bool) -> list[Block]:
    """Blocks that run from a marker to an end marker (generated or figures blocks)."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    for i, raw in enumerate(lines):
        m = marker.match(raw.strip())
        if not m:
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == end_line), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: this block needs its end line {end_line!r}")
        slow, needs, timeout_s = _options(path, i + 1, m.group(1) or "")
        body = tuple(line.rstrip() for line in lines[i + 1 : end])
        out.append(Block(path, i + 1, m.group(2), slow, body, needs, timeout_s, end=end + 1, prose=prose))
    return out


def all_blocks(files: list[Path] | None = None) -> list[Block]:
    """Every marked block of README.md and docs/*.md (or of `files`): output-of blocks, generated ones, then
    figures blocks."""
    files = doc_files() if files is None else files
    return [b for find in (blocks, generated_blocks, figures_blocks) for p in files for b in find(p)]


def named_blocks(ids: list[str]) -> list[Block]:
    """The blocks `ids` names, in order: `FILE:LINE` one block, `FILE` every [slow] block of it (none: of every
    doc). Files are relative to the repository root or the working directory."""
    if not ids:
        return [b for b in all_blocks() if b.slow]
    out: list[Block] = []
    for name in ids:
        file, _, line = name.rpartition(":") if name.rpartition(":")[2].isdigit() else (name, "", "")
        path = next((p for p in (ROOT / file, Path(file).resolve()) if p.is_file()), None)
        if path is None:
            raise ValueError(f"{name}: no such doc file {file!r}")
        found = all_blocks([path])
        pick = [b for b in found if b.line == int(line)] if line else [b for b in found if b.slow]
        if line and not pick:
            raise ValueError(f"{name}: no marked block starts at line {line} of {file} (see --list)")
        out.extend(b for b in pick if b not in out)
    return out


def save(block: Block, folder: Path) -> str:
    """Run a block's command (once per process), write its output to `folder/<id>.out` and the comparison to
    `folder/<id>.json`; return OK, STALE, ERR or SKIP."""
    stem = re.sub(r"[/:\\]", "_", block.where).lstrip("_")
    report: dict[str, object] = {"id": block.where, "ok": False, "problems": [], "err": None, "seconds": 0.0}
    absent = block.missing()
    if absent:
        report["err"] = f"skipped: {absent} absent"
        verdict = "SKIP"
    else:
        t0 = time.monotonic()
        try:
            output = run(block)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            report["err"], verdict = str(exc), "ERR"
        else:
            (folder / f"{stem}.out").write_text(output)
            problems = differences(block, output)
            report["problems"], report["ok"] = problems, not problems
            verdict = "STALE" if problems else "OK"
        report["seconds"] = round(time.monotonic() - t0, 3)
    (folder / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    return verdict


FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|ns|GB/s|Gb/s|Gbps|TB/s|KB|MB|GB|KiB|MiB|GiB|%|x\b|×)")
CODE_SPAN = re.compile(r"`[^`]*`")  # a setting or an input the prose recalls, as `--set buffer_bytes=2000000`
DATED = re.compile(r"20\d\d-\d\d-\d\d|checked|block (?:above|below)|output-of|generated")
CELL = re.compile(r"(?<!\\)\|")  # a table cell border (not an escaped `\|`)
COLUMNS_CHECKED = re.compile(r"<!-- columns (?:checked|not simulated): ([^(;>]*)")  # names, to "(" or ";"
# a data sheet, a paper, an input; or one day's run that no test re-runs
SPAN = re.compile(r"^<!--\s*(not simulated|dated) ?(20\d\d-\d\d-\d\d)?:\s*(\S.*?)\s*-->\s*$")


def unchecked_spans(path: Path) -> set[int]:
    """1-based lines of the file's `not simulated` and `dated` spans, their markers included (a span needs its end
    line; a dated one its date)."""
    lines = path.read_text().splitlines()
    out: set[int] = set()
    for i, raw in enumerate(lines):
        if not (m := SPAN.match(raw.strip())):
            continue
        kind = m.group(1)
        if (kind == "dated") != bool(m.group(2)):
            raise ValueError(
                f"{path.name}:{i + 1}: write <!-- dated YYYY-MM-DD: ... --> or <!-- not simulated: ... -->"
            )
        end_line = f"<!-- end of {kind} -->"
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == end_line), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: this span needs its end line {end_line!r}")
        out.update(range(i + 1, end + 2))
    return out


def unchecked(path: Path) -> list[tuple[int, str]]:
    """(line, text) of prose and table lines outside marked blocks and `not simulated` or `dated` spans that quote
    a figure with a unit (outside code spans, which hold settings, and `not simulated` columns) whose number no
    marked block of the file holds, and name no date and no checking block: candidates for a check, or for a date
    (an audit aid, a heuristic)."""
    lines = path.read_text().splitlines()
    inside = unchecked_spans(path)
    held: set[str] = set()
    for b in [*blocks(path), *generated_blocks(path), *figures_blocks(path)]:
        inside.update(range(b.line, (b.end or b.line + len(b.quoted) + 3) + 1))
        held.update(re.findall(r"\d[\d,]*(?:\.\d+)?", " ".join(b.quoted)))
    out, fenced = [], False
    checked_columns: set[str] = set()  # of the table below a "columns checked" comment
    header: list[str] = []
    for no, raw in enumerate(lines, 1):
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not raw.startswith("|"):
            header = []
            if not raw.lstrip().startswith("<!--"):
                checked_columns = set()
        elif not header:
            header = [c.strip() for c in CELL.split(raw)[1:-1]]
        elif checked_columns:
            cells = CELL.split(raw)
            raw = "|".join(
                c for i, c in enumerate(cells) if i < 1 or i > len(header) or header[i - 1] not in checked_columns
            )
        if found := COLUMNS_CHECKED.match(raw.strip()):
            checked_columns = {c.strip() for c in found.group(1).split(",") if c.strip()}
        if fenced or no in inside or raw.lstrip().startswith("<!--"):
            continue
        figures = [re.match(r"\d[\d,]*(?:\.\d+)?", m.group(0)) for m in FIGURE.finditer(CODE_SPAN.sub(" ", raw))]
        loose = [f.group(0) for f in figures if f and f.group(0) not in held]
        if loose and not DATED.search(raw):
            out.append((no, raw.strip()))
    return out


def _trimmed(lines: list[str] | tuple[str, ...]) -> list[str]:
    """Lines without trailing spaces, and without blank lines at either end."""
    out = [line.rstrip() for line in lines]
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def prose_figures(lines: tuple[str, ...] | list[str]) -> list[tuple[int, str]]:
    """(line index, number) of every figure with a unit in prose lines, outside fenced blocks, marker comments,
    dated lines and code spans (settings and inputs), thousands separators dropped."""
    out: list[tuple[int, str]] = []
    fenced = False
    for k, raw in enumerate(lines):
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or raw.lstrip().startswith("<!--") or DATED.search(raw):
            continue
        for m in FIGURE.finditer(CODE_SPAN.sub(" ", raw)):
            number = NUMBER.match(m.group(0))
            if number:
                out.append((k, number.group(0).replace(",", "")))
    return out


def missing_figures(lines: tuple[str, ...] | list[str], output: str) -> list[str]:
    """The prose's figures that the output does not print as numbers (empty: every figure holds)."""
    printed = {n.replace(",", "") for n in NUMBER.findall(output)}
    return [
        f"line {k + 1}: {n} is not in the output: {lines[k].strip()[:120]}"
        for k, n in prose_figures(lines)
        if n not in printed
    ]


def differences(block: Block, output: str) -> list[str]:
    """What of a block the output does not hold: quoted lines (output-of), any differing line (generated) or a
    figure the output does not print (figures)."""
    if block.prose:
        return missing_figures(block.quoted, output)
    if not block.end:
        return mismatches(block.quoted, output)
    want, got = _trimmed(block.quoted), _trimmed(output.splitlines())
    pairs = enumerate(zip(want, got, strict=False))
    problems = [f"line {k + 1}: block: {a}\n  output: {b}" for k, (a, b) in pairs if a != b]
    if len(want) != len(got):
        problems.append(f"the block has {len(want)} lines, the output {len(got)}")
    return problems


def regenerate(block: Block) -> None:
    """Write the command's fresh output into a generated block (a blank line at each end)."""
    lines = block.path.read_text().splitlines()
    body = ["", *_trimmed(run(block).splitlines()), ""]
    lines[block.line : block.end - 1] = body
    block.path.write_text("\n".join(lines) + "\n")


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


_OUTPUTS: dict[str, str] = {}


def run(block: Block, timeout: float | None = None) -> str:
    """The command's stdout and stderr, run with bash from the repository root (a failure raises). A command
    that two blocks share (a quoted table and the prose explaining it) runs once per process."""
    if block.command not in _OUTPUTS:
        _OUTPUTS[block.command] = _run(block, timeout)
    return _OUTPUTS[block.command]


def _run(block: Block, timeout: float | None) -> str:
    """Run a block's command once."""
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
    ap.add_argument("--regenerate", metavar="FILE:LINE", help="write a generated block's fresh output into it")
    ap.add_argument("--unchecked", metavar="FILE", help="lines quoting a figure with no date and no checking block")
    ap.add_argument("--save", metavar="DIR", help="run the named blocks once, keep DIR/<id>.out and <id>.json")
    ap.add_argument("ids", nargs="*", metavar="ID", help="with --save: FILE:LINE blocks, FILE's [slow] blocks")
    args = ap.parse_args(argv)
    if args.ids and not args.save:
        ap.error("block ids go with --save DIR")
    if args.save:
        try:
            picked = named_blocks(args.ids)
        except ValueError as exc:
            ap.error(str(exc))
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        verdicts = []
        for b in picked:
            verdicts.append(save(b, folder))
            print(f"{verdicts[-1]:5}  {b.where}  {b.command}", flush=True)
        print(f"{verdicts.count('OK')} OK, {verdicts.count('STALE')} STALE, {verdicts.count('ERR')} ERR, "
              f"{verdicts.count('SKIP')} SKIP; saved in {folder}")  # fmt: skip
        return 0 if all(v in ("OK", "SKIP") for v in verdicts) else 1
    if args.unchecked:
        found_lines = unchecked(ROOT / args.unchecked)
        for no, text in found_lines:
            print(f"{args.unchecked}:{no}: {text[:150]}")
        print(f"{len(found_lines)} line(s)")
        return 0
    found = all_blocks()
    if args.show or args.regenerate:
        pick = [b for b in found if b.where == (args.show or args.regenerate)]
        if not pick or (args.regenerate and (not pick[0].end or pick[0].prose)):
            ap.error(f"no {'generated' if args.regenerate else 'marked'} block there (see --list)")
        if args.regenerate:
            regenerate(pick[0])
        else:
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
        problems = differences(b, run(b))
        print(f"{b.where}: {'ok' if not problems else f'{len(problems)} line(s) differ'}")
        for p in problems:
            print("  " + p)
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
