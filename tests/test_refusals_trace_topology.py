"""Two refusals the 2026-12-03 audit left open (docs/status.md "Bad input and failure audit"): `--trace-steps`
given with `--trace none` (it has nothing to cap: it was taken silently), and a topology file whose format cannot be
told (a JSON file was told to "pass --format", an option only `phantora topo` has, without the formats)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.commands.run import trace_steps
from phantora.errors import InputError
from phantora.rank_options import DEFAULT_TRACE_STEPS
from phantora.topology import load_topology

FORMATS = ("toml (a .toml file", "hpcc (a first line of 3 fields", "simai (6 or 7 fields)")


def test_trace_steps_with_trace_none_is_refused_naming_both(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "-q", "-t", "testbed16", "--nproc", "2", "--trace", "none", "--trace-steps", "2"]
    assert main([*argv, "examples/cuda_ddp.py"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phantora run: error: field '--trace-steps': 2 caps the compute ops")
    assert "--trace none" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("trace", "given", "steps"),
    [("none", None, DEFAULT_TRACE_STEPS), ("ops", 2, 2), ("coarse", 0, 0), ("ops", None, DEFAULT_TRACE_STEPS)],
)
def test_trace_steps_alone_or_with_a_traced_level_is_taken(trace: str, given: int | None, steps: int) -> None:
    assert trace_steps(argparse.Namespace(trace=trace, trace_steps=given)) == steps


def test_a_json_topology_names_the_file_and_the_formats(tmp_path: Path) -> None:
    for name, text in (("fabric.json", '{"nodes": [], "links": []}\n'), ("fabric.dat", '{"a": 1, "b":\n')):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(InputError) as err:
            load_topology(path)
        assert err.value.file == str(path) and str(err.value).startswith(f"{path}: JSON is not a topology format")
        assert all(f in str(err.value) for f in FORMATS)


def test_an_unknown_first_line_names_file_line_and_the_formats(tmp_path: Path) -> None:
    path = tmp_path / "fabric.txt"
    path.write_text("# a comment\n4 1 2 3 extra\n")
    with pytest.raises(InputError) as err:
        load_topology(path)
    text = str(err.value)
    assert text.startswith(f"{path}:1: cannot tell the topology format from the first line (5 fields)")
    assert all(f in text for f in FORMATS) and "phantora topo FILE --format NAME" in text
