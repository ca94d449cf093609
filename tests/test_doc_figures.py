"""Figures quoted in README.md and docs/*.md are what their commands print (scripts/doc_figures.py).

Each `<!-- output-of: CMD -->` block is run and compared line by line, exactly; `output-of[slow]` blocks run
with `-m slow`. The matcher itself is tested on small strings first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_modules import load

ROOT = Path(__file__).resolve().parents[1]
doc_figures = load("scripts/doc_figures.py")

OUTPUT = "header\nrow a  1.00\nrow b  2.00   \nmakespan: 3.00 µs simulated, 1.2 s wall\n"


def test_a_quote_holds_when_its_lines_are_output_lines_in_order() -> None:
    assert doc_figures.mismatches(["row a  1.00", "...", "makespan: 3.00 µs simulated, ..."], OUTPUT) == []
    assert doc_figures.mismatches(["header", "row b  2.00"], OUTPUT) == []  # rows may be left out


def test_a_changed_figure_is_reported_with_the_line_printed_now() -> None:
    problems = doc_figures.mismatches(["row a  1.01"], OUTPUT)
    assert len(problems) == 1 and "row a  1.00" in problems[0]
    assert doc_figures.mismatches(["row b  2.00", "row a  1.00"], OUTPUT)  # order counts
    assert doc_figures.mismatches(["makespan: 3.00 µs simulated, 1.3 s wall"], OUTPUT)  # no prefix without ' ...'


def test_markers_are_parsed(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("text\n<!-- output-of[slow]: echo hi -->\n```\nhi\n```\n<!-- output-of: true -->\n```\n```\n")
    found = doc_figures.blocks(md)
    got = [(b.line, b.command, b.slow, b.quoted) for b in found]
    assert got == [(2, "echo hi", True, ("hi",)), (6, "true", False, ())]
    md.write_text("<!-- output-of[slow, needs=reference-runs]: echo hi -->\n```\nhi\n```\n")
    (block,) = doc_figures.blocks(md)
    assert (block.slow, block.needs) == (True, "reference-runs")
    md.write_text("<!-- output-of[timeout=900]: echo hi -->\n```\nhi\n```\n")
    (block,) = doc_figures.blocks(md)
    assert (block.slow, block.timeout_s) == (False, 900.0)
    assert [m.kwargs for m in marks(block)] == [{}] and marks(block)[0].args == (900.0,)
    md.write_text("<!-- output-of[timeout=soon]: echo hi -->\n```\n```\n")
    with pytest.raises(ValueError, match="x.md:1: timeout='soon'"):
        doc_figures.blocks(md)
    md.write_text("<!-- output-of[fast]: echo hi -->\n```\n```\n")
    with pytest.raises(ValueError, match="unknown output-of option"):
        doc_figures.blocks(md)
    md.write_text("<!-- output-of: echo hi -->\nno block\n")
    with pytest.raises(ValueError, match="fenced block"):
        doc_figures.blocks(md)


def test_a_generated_block_is_checked_whole_and_regenerated(tmp_path: Path, monkeypatch) -> None:
    md = tmp_path / "x.md"
    text = "intro\n<!-- generated: printf 'a\\nb\\n' -->\n\na\nb\n\n<!-- end of generated block -->\nafter\n"
    md.write_text(text)
    monkeypatch.setattr(doc_figures, "ROOT", tmp_path)
    (block,) = doc_figures.generated_blocks(md)
    assert (block.line, block.end, block.command) == (2, 7, "printf 'a\\nb\\n'")
    assert doc_figures.differences(block, "a\nb\n") == []
    assert doc_figures.differences(block, "a\nc\n")  # a changed line
    assert doc_figures.differences(block, "a\nb\nextra\n")  # unlike output-of, no extra line is allowed
    md.write_text(md.read_text().replace("\nb\n\n<!--", "\nold\n\n<!--"))
    doc_figures.regenerate(doc_figures.generated_blocks(md)[0])
    assert md.read_text() == text
    md.write_text("<!-- generated: true -->\nno end\n")
    with pytest.raises(ValueError, match="end line"):
        doc_figures.generated_blocks(md)


BLOCKS = doc_figures.all_blocks()
# A slow block runs a study (a sweep, several live jobs): minutes on a quiet machine, more when it is shared, so
# it gets more than the suite's 300 s.
SLOW = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_docs_have_checked_figures() -> None:
    assert any(b.path.name == "tutorial.md" for b in BLOCKS)


def marks(block: doc_figures.Block) -> list[pytest.MarkDecorator]:
    """A slow block's marks; a fast one's own time limit, if it names one (`[timeout=SECONDS]`)."""
    if block.slow:
        return SLOW
    return [pytest.mark.timeout(block.timeout_s)] if block.timeout_s else []


@pytest.mark.parametrize("block", [pytest.param(b, marks=marks(b), id=b.where) for b in BLOCKS])
def test_quoted_output_is_what_the_command_prints(block) -> None:
    if block.missing():
        pytest.skip(f"{block.missing()} absent (shared data the command reads)")
    problems = doc_figures.differences(block, doc_figures.run(block))
    assert not problems, f"{block.where}: `{block.command}` now prints otherwise:\n" + "\n".join(problems)


def test_save_keeps_each_blocks_output_and_its_differences(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--save DIR ID`: the block's output in DIR/<id>.out, the comparison in DIR/<id>.json, OK or STALE printed;
    a doc named whole saves its [slow] blocks only."""
    monkeypatch.setattr(doc_figures, "ROOT", tmp_path)
    md, out = tmp_path / "x.md", tmp_path / "saved"
    md.write_text("a\n<!-- output-of: echo 'took 1.50 us' -->\n```\ntook 1.50 us\n```\n")
    assert doc_figures.main(["--save", str(out), "x.md:2"]) == 0
    assert (out / "x.md_2.out").read_text() == "took 1.50 us\n"
    report = json.loads((out / "x.md_2.json").read_text())
    assert report["id"] == "x.md:2" and report["ok"] is True and report["problems"] == [] and report["err"] is None
    assert report["seconds"] >= 0 and capsys.readouterr().out.startswith("OK ")
    md.write_text(md.read_text().replace("1.50 us\n```", "1.60 us\n```"))
    assert doc_figures.main(["--save", str(out), "x.md:2"]) == 1
    report = json.loads((out / "x.md_2.json").read_text())
    assert report["ok"] is False and "took 1.60 us" in report["problems"][0]
    assert capsys.readouterr().out.startswith("STALE ")
    assert doc_figures.main(["--save", str(out / "whole"), "x.md"]) == 0  # no [slow] block in x.md
    assert not list((out / "whole").iterdir())


def test_the_audit_finds_a_figure_no_block_holds(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    block = "<!-- output-of: echo -->\n```\nmakespan 12.5 µs\n```\n"
    prose = "It took 12.5 µs.\nIt took 9.1 µs.\nOn 2026-11-29 it took 3.0 s wall, 40 %.\nA 400G NIC.\n"
    md.write_text(block + prose)
    assert doc_figures.unchecked(md) == [(6, "It took 9.1 µs.")]  # 12.5 is held; a dated line is an indication


def test_a_figures_block_holds_when_every_figure_is_printed(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "<!-- figures-from[slow]: echo -->\n"
        "DCTCP marks 7,916 packets (7,916 KB) and is 2.7 % shorter (`Kmin = 4 KB`).\n"
        "```\nfenced 99.9 µs is checked by its own marker\n```\n"
        "On 2026-11-29 it took 3.5 ms wall.\n"
        "<!-- end of figures -->\n"
        "Outside: 12.0 µs.\n"
    )
    (block,) = doc_figures.figures_blocks(md)
    assert (block.line, block.end, block.slow, block.prose) == (1, 7, True, True)
    assert doc_figures.differences(block, "marks 7916\nmakespan -2.7%\n") == []
    problems = doc_figures.differences(block, "marks 7917\nmakespan -2.7%\n")
    assert len(problems) == 1 and "7916" in problems[0]  # a changed figure is named, with its line
    assert doc_figures.differences(block, "marks 7916\nmakespan -2.70%\n")  # the same digits, not the same value
    assert doc_figures.unchecked(md) == [(8, "Outside: 12.0 µs.")]  # the block's lines count as checked
    md.write_text("<!-- figures-from: echo -->\nno end\n")
    with pytest.raises(ValueError, match="end line"):
        doc_figures.figures_blocks(md)


def test_figures_said_not_simulated_are_left_alone_and_no_others(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "<!-- columns not simulated: published (the paper) -->\n"
        "| run | published | simulated |\n"
        "|---|---:|---:|\n"
        "| a | 137 % | 135.3 % |\n"
        "\n"
        "<!-- not simulated: the data sheet -->\n"
        "The H100 moves 3.35 TB/s.\n"
        "<!-- end of not simulated -->\n"
        "The model gives 2.9 TB/s.\n"
    )
    found = doc_figures.unchecked(md)
    assert [no for no, _ in found] == [4, 9]  # the simulated column and the prose after the span
    assert "137" not in found[0][1] and "135.3" in found[0][1]
    md.write_text("<!-- not simulated: a paper -->\nno end 3 µs\n")
    with pytest.raises(ValueError, match="end line"):
        doc_figures.unchecked(md)


def test_a_dated_span_leaves_its_paragraph_alone_and_needs_its_date(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "<!-- dated 2026-11-29: an audit of 13 min -->\nThe call took 29.71 µs,\nthe other 66.324 µs.\n"
        "<!-- end of dated -->\nToday it takes 29.12 µs.\n"
    )
    assert doc_figures.unchecked(md) == [(5, "Today it takes 29.12 µs.")]
    md.write_text("<!-- dated: no date -->\n3 µs\n<!-- end of dated -->\n")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        doc_figures.unchecked(md)


def test_every_quoted_figure_is_checked_dated_or_said_not_simulated() -> None:
    """The audit holds: no README or docs/*.md line quotes a figure with a unit that no block checks, no date
    marks and no `not simulated` span or column names (scripts/doc_figures.py --unchecked FILE lists them)."""
    found = [
        f"{p.relative_to(ROOT)}:{no}: {text[:100]}"
        for p in doc_figures.doc_files()
        for no, text in doc_figures.unchecked(p)
    ]
    assert not found, "figures to check, date or mark (see doc_figures.py's docstring):\n" + "\n".join(found)
