"""`phantora replay GRAPH_DIR`: results, scale-up report, Chakra export, and clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_egraph_replay import MiB, cosim, ddp_script, star

from phantora.cli import main


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    cosim(star(8), [ddp_script(r, 8, 2, 8 * MiB, 500_000) for r in range(8)], record=tmp_path / "trace")
    return tmp_path / "trace"


def test_cli_replays_a_graph_and_matches_the_recording(trace: Path, tmp_path: Path, capsys) -> None:
    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert main(["replay", str(trace), "--topology", "testbed16", "--out", str(out)]) == 0
        outs.append((out / "results.json").read_text())
    assert outs[0] == outs[1]  # deterministic, no wall-clock figure
    text = capsys.readouterr().out
    assert "execution graph (8 ranks, 1 distinct programs)" in text and "recorded" in text
    data = json.loads(outs[0])
    assert len(data["step_times_ns"]) == 2 and data["comm"]["all_reduce"]["count"] == 4
    assert data["recorded_step_times_ns"]


def test_cli_scale_dp_prints_its_assumptions_and_exports_chakra(trace: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("google.protobuf")
    rc = main(["replay", str(trace), "-t", "testbed16", "--scale-dp", "16", "--export-chakra", str(tmp_path / "et")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "re-targeted ddp: 8 -> 16 ranks" in text and "weak scaling" in text
    assert len(list((tmp_path / "et").glob("phantora.*.et"))) == 16


def test_cli_errors_name_the_file(trace: Path, capsys) -> None:
    (trace / "programs" / "p0.msgpack").write_bytes(b"\x00")
    assert main(["replay", str(trace), "-t", "testbed16"]) == 2
    err = capsys.readouterr().err
    assert "p0.msgpack" in err and "SHA-256" in err
    assert main(["replay", str(trace), "-t", "testbed16", "--scale-dp", "12"]) == 2


def test_cli_graph_larger_than_the_topology(trace: Path, capsys) -> None:
    assert main(["replay", str(trace), "-t", "testbed16", "--scale-dp", "32"]) == 2
    assert "32 ranks but the topology 'testbed16' has 16" in capsys.readouterr().err


def test_cli_set_is_checked_for_ns3_and_flow_takes_only_ecmp_hash(trace: Path, capsys) -> None:
    assert main(["replay", str(trace), "-t", "testbed16", "--network", "ns3", "--set", "no_such_field=1"]) == 2
    assert "no_such_field" in capsys.readouterr().err
    assert main(["replay", str(trace), "-t", "testbed16", "--set", "buffer_bytes=1000000"]) == 2
    assert "field 'buffer_bytes': applies to --network ns3 only" in capsys.readouterr().err
    assert main(["replay", str(trace), "-t", "testbed16", "--set", "ecmp_hash=nope"]) == 2
    assert "ecmp_hash" in capsys.readouterr().err
    assert main(["replay", str(trace), "-t", "testbed16", "--set", "ecmp_hash=hpcc"]) == 0
