"""`phantora rerun DIR` of replay and netsim directories: the same settings give the same figures, exactly; the
rerun names its original; a moved or changed input is refused with one line that names it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_egraph_replay import MiB, cosim, ddp_script, star

from phantora.cli import main
from phantora.errors import InputError
from phantora.results import inputs
from phantora.results.provenance import read_config

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "ddp_buckets.toml"
INCAST = ROOT / "workloads" / "incast4.flows.txt"


def _json(d: Path, name: str = "results.json") -> dict:
    return json.loads((d / name).read_text())


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_rerun_of_a_replay_reuses_its_settings_and_reproduces_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(WORKLOAD, "wl.toml")
    shutil.copy(ROOT / "topologies" / "star8.toml", "topo.toml")
    common = ["replay", "wl.toml", "-t", "topo.toml", "-q"]
    assert main([*common, "--channels", "1", "--granularity", "chunked", "--out", "orig"]) == 0
    assert main([*common, "--out", "defaults"]) == 0
    capsys.readouterr()
    assert main(["rerun", "orig", "-q"]) == 0
    assert "reproduced: results.json figures, flows.csv, links.csv identical" in capsys.readouterr().out
    orig, again = _json(tmp_path / "orig"), _json(tmp_path / "orig-rerun")
    assert again == orig  # replay's results.json holds no wall-clock figure
    assert again["makespan_ns"] != _json(tmp_path / "defaults")["makespan_ns"]  # the recorded settings were used
    for name in ("flows.csv", "links.csv"):
        assert (tmp_path / "orig" / name).read_bytes() == (tmp_path / "orig-rerun" / name).read_bytes()
    config = read_config(tmp_path / "orig-rerun")
    origin = config["rerun_of"]
    assert origin["dir"] == str(tmp_path / "orig") and origin["kind"] == "replay"
    assert origin["config_sha256"] == hashlib.sha256((tmp_path / "orig" / "config.json").read_bytes()).hexdigest()
    assert origin["command"][:3] == ["phantora", "replay", "wl.toml"]
    assert config["options"]["channels"] == 1 and config["options"]["granularity"] == "chunked"
    first = read_config(tmp_path / "orig")
    assert config["inputs"] == first["inputs"] and config["options"] == first["options"]
    assert json.loads((tmp_path / "orig-rerun" / "status.json").read_text())["state"] == "complete"

    # a changed workload, a moved one, a changed topology: one line naming the file; nothing written
    Path("wl.toml").write_text(Path("wl.toml").read_text().replace("25MiB", "24MiB", 1))
    err = _refused(["rerun", "orig", "--out", "x"], capsys)
    assert f"INPUT {tmp_path / 'wl.toml'} changed since the run" in err and "config.json" in err
    Path("wl.toml").unlink()
    err = _refused(["rerun", "orig", "--out", "x"], capsys)
    assert f"INPUT {tmp_path / 'wl.toml'}: the run's input file is gone" in err
    shutil.copy(WORKLOAD, "wl.toml")
    Path("topo.toml").write_text(Path("topo.toml").read_text().replace('rate = "100Gbps"', 'rate = "200Gbps"'))
    err = _refused(["rerun", "orig", "--out", "x"], capsys)
    assert "topology 'topo.toml' changed since the run" in err
    assert not (tmp_path / "x").exists()


def test_rerun_of_a_netsim_run_reproduces_it(tmp_path: Path, capsys) -> None:
    flows = tmp_path / "incast.txt"
    shutil.copy(INCAST, flows)
    orig = tmp_path / "n"
    argv = ["netsim", "-t", "star8", "-f", str(flows), "--set", "payload_bytes=500", "-q"]
    assert main([*argv, "--out", str(orig)]) == 0
    capsys.readouterr()
    assert main(["rerun", str(orig), "-q", "--out", str(tmp_path / "again")]) == 0
    assert "reproduced: summary.json figures, flows.csv, links.csv, fct.txt identical" in capsys.readouterr().out
    a, b = (_json(d, "summary.json") for d in (orig, tmp_path / "again"))
    assert a.pop("wall_s") >= 0 and b.pop("wall_s") >= 0
    assert a == b and a["payload_efficiency"] == 500 / 548  # --set payload_bytes=500 over 48-byte headers
    assert read_config(tmp_path / "again")["rerun_of"]["dir"] == str(orig)
    # settings that resolve otherwise now (as after a change of a default) are refused, the field named
    doc = read_config(orig)
    doc["packet"]["fields"]["payload_bytes"] = 600
    (orig / "config.json").write_text(json.dumps(doc))
    err = _refused(["rerun", str(orig), "--out", str(tmp_path / "x")], capsys)
    assert "packet.fields.payload_bytes: 600 vs 500" in err and not (tmp_path / "x").exists()
    doc["packet"]["fields"]["payload_bytes"] = 500
    del doc["inputs"]  # a run recorded before inputs were: rerun, and say they are not checked
    (orig / "config.json").write_text(json.dumps(doc))
    assert main(["rerun", str(orig), "-q", "--out", str(tmp_path / "older")]) == 0
    assert "its input files are not checked" in capsys.readouterr().out
    doc["inputs"] = read_config(tmp_path / "again")["inputs"]
    (orig / "config.json").write_text(json.dumps(doc))
    flows.write_text(flows.read_text() + "\n")
    err = _refused(["rerun", str(orig)], capsys)
    assert f"--flows {flows} changed since the run (" in err and "bytes, the run read" in err


def test_rerun_of_a_graph_replay_checks_every_file_of_the_graph(tmp_path: Path, capsys) -> None:
    graph = tmp_path / "graph"
    cosim(star(8), [ddp_script(r, 8, 2, 8 * MiB, 500_000) for r in range(8)], record=graph)
    orig = tmp_path / "g"
    assert main(["replay", str(graph), "-t", "testbed16", "-q", "--out", str(orig)]) == 0
    capsys.readouterr()
    assert main(["rerun", str(orig), "-q"]) == 0
    assert "reproduced: results.json figures, flows.csv, links.csv identical" in capsys.readouterr().out
    assert _json(orig) == _json(tmp_path / "g-rerun") and _json(orig)["step_times_ns"]
    program = next((graph / "programs").iterdir())
    program.write_bytes(program.read_bytes() + b"\0")
    err = _refused(["rerun", str(orig)], capsys)
    assert f"INPUT {graph}: programs/{program.name} changed since the run" in err


def test_inputs_name_what_changed_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("a", "b"):
        (tmp_path / "d" / name).write_text(name)
    rec = inputs.record(tmp_path / "d")
    assert rec["files"]["a"] == hashlib.sha256(b"a").hexdigest()
    assert inputs.check("INPUT", rec, "c.json") == tmp_path / "d"
    (tmp_path / "d" / "c").write_text("c")
    with pytest.raises(InputError, match="c was added since the run"):
        inputs.check("INPUT", rec, "c.json")
    (tmp_path / "d" / "c").unlink()
    (tmp_path / "d" / "b").unlink()
    with pytest.raises(InputError, match="b is gone since the run"):
        inputs.check("INPUT", rec, "c.json")
    shutil.rmtree(tmp_path / "d")
    with pytest.raises(InputError, match="input directory is gone"):
        inputs.check("INPUT", rec, "c.json")


def test_rerun_refuses_a_seed_group_and_names_its_runs(tmp_path: Path, capsys) -> None:
    group = tmp_path / "s"
    assert main(["netsim", "-t", "star8", "-f", str(INCAST), "--seeds", "2", "-q", "--out", str(group)]) == 0
    err = _refused(["rerun", str(group)], capsys)
    assert "seed group" in err and "seed1" in err


@pytest.mark.slow  # ~40 s: two ns-3 runs
def test_rerun_of_a_packet_netsim_run_reproduces_every_trace(tmp_path: Path, capsys) -> None:
    orig = tmp_path / "n"
    argv = ["netsim", "-t", "star8", "-f", str(INCAST), "--network", "ns3", "--cc", "dcqcn"]
    assert main([*argv, "--set", "buffer_bytes=2000000", "--out", str(orig)]) == 0  # with progress lines
    assert main(["rerun", str(orig), "-q"]) == 0
    traces = ("flows.csv", "pfc.csv", "queues.csv", "cnps.csv", "ecn_marks.csv", "fct.txt", "ns3-calls.txt")
    for name in traces:
        assert (orig / name).read_bytes() == (tmp_path / "n-rerun" / name).read_bytes(), name
    assert len((orig / "pfc.csv").read_text().splitlines()) > 1  # the 2 MB buffer made PFC pause
    config = read_config(tmp_path / "n-rerun")
    assert config["packet"] == read_config(orig)["packet"] and config["packet"]["fields"]["buffer_bytes"] == 2_000_000


def test_a_run_directory_gives_back_the_engine_it_recorded() -> None:
    """config.json's options.engine (EngineSpec.to_dict as JSON) is the run's engine again, field for field; a run
    from before issue 35 (flat network, cc, packet_set, window_ns ...) is built from those flags as it was then."""
    from phantora.commands.rerun import recorded_engine
    from phantora.netsim.cli_config import engine_spec_from_flags
    from phantora.results.provenance import plain

    spec = engine_spec_from_flags("ns3", cc="dcqcn", sets=["buffer_bytes=2MB", "kmax_map=100Gbps 90000"], window_ns=7)
    options = {"nproc": 2, "engine": json.loads(json.dumps(plain(spec.to_dict())))}
    assert recorded_engine(options) == spec and options["nproc"] == 2
    old = {"network": "ns3", "cc": "dcqcn", "packet_set": ["buffer_bytes=2MB", "kmax_map=100Gbps 90000"],
           "window_ns": 7, "queue_sample_ns": None, "seed": None, "scenario": None, "nproc": 2}  # fmt: skip
    assert recorded_engine(old) == spec and old == {"nproc": 2}  # the flat options are taken out
