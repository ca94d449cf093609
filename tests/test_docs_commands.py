"""Every `phantora` command in README.md and the docs parses against the CLI as it is now.

Commands are taken from fenced code blocks: lines that run `phantora` (or `.venv/bin/phantora`, or
`../../.venv/bin/phantora`), with `\\` continuations joined and comments dropped; `...` placeholders,
usage synopses with `[--optional]` parts and quoted messages (`phantora run: error: ...`) are skipped, and so
are the blocks that quote a command's output (`<!-- output-of: ... -->` above them: scripts/doc_figures.py).
Parsing checks the sub-command, the options
and their choices, not that files exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from phantora.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INVOKE = re.compile(r"(?:^|&&|;|\s)(?:\S*/)?phantora\s+(\S.*)$")


def commands(path: Path) -> list[tuple[int, str]]:
    """(line, command after `phantora`) of each phantora command in the file's code blocks."""
    out: list[tuple[int, str]] = []
    fenced = quoted = False
    joined, start, previous = "", 0, ""
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            quoted = fenced and previous.lstrip().startswith("<!-- output-of")  # a command's output, quoted
            continue
        previous = raw
        if not fenced or quoted:
            continue
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if joined:
            joined += " " + line.rstrip("\\").strip()
        else:
            joined, start = line.rstrip("\\").strip(), no
        if line.endswith("\\"):
            continue
        m = INVOKE.search(joined.split("; cd -")[0])
        synopsis = "..." in joined or " [-" in joined  # usage lines with placeholders and [optional] parts
        output = m is not None and re.match(r"[\w-]+: ", m.group(1)) is not None  # `phantora run: error: ...`
        if m and not synopsis and not output and not joined.startswith(("import", "from", "$")):
            out.append((start, m.group(1).split(" && ")[0].split(" | ")[0]))
        joined = ""
    return out


CASES = [(p, no, cmd) for p in DOCS for no, cmd in commands(p)]


def test_the_docs_have_commands_to_check() -> None:
    assert len(CASES) > 30 and any(p.name == "README.md" for p, _, _ in CASES)


@pytest.mark.parametrize(("path", "line", "command"), CASES, ids=[f"{p.name}:{n}" for p, n, _ in CASES])
def test_documented_command_parses(path: Path, line: int, command: str) -> None:
    parser = build_parser()
    try:
        parser.parse_args(shlex.split(command))
    except SystemExit as exc:
        pytest.fail(f"{path.name}:{line}: `phantora {command}` does not parse (exit {exc.code})")


def test_a_quoted_output_is_not_taken_for_a_command(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```\n.venv/bin/phantora topo rail128\n```\n"
        "<!-- output-of: .venv/bin/python bench/x.py -->\n```\nincast   phantora   668.8   697.0\n```\n"
        "```\nphantora netsim flows.csv\n```\n"
    )
    assert commands(doc) == [(2, "topo rail128"), (9, "netsim flows.csv")]
