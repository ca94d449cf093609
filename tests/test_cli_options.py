"""The options run, replay, netsim and sweep share: the same names, defaults, choices and checks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import build_parser, main
from phantora.netsim.packet_config import PacketConfig

ROOT = Path(__file__).resolve().parents[1]
INCAST = ROOT / "workloads" / "incast_heavy.toml"
SHARED = ("--network", "--cc", "--set", "--progress", "--quiet", "--out", "--overwrite")
ONE_RUN = ("run", "replay", "netsim")


def parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def option(p: argparse.ArgumentParser, name: str) -> argparse.Action:
    return p._option_string_actions[name]


def signature(a: argparse.Action) -> str:
    """What makes two options behave alike (not their help text)."""
    return repr((type(a).__name__, a.option_strings, a.default, a.choices, a.nargs, a.const, a.type, a.metavar))


def test_the_shared_options_are_defined_alike_on_every_command() -> None:
    ps = parsers()
    for name in SHARED:
        sigs = {cmd: signature(option(ps[cmd], name)) for cmd in ONE_RUN}
        assert len(set(sigs.values())) == 1, (name, sigs)
    assert option(ps["run"], "--network").default == "flow" and option(ps["run"], "--network").choices == (
        "flow",
        "ns3",
    )
    assert option(ps["netsim"], "--cc").choices is None  # any registered name; the registry checks it
    for name in ("--progress", "--quiet"):  # sweep and rerun too
        for cmd in ("sweep", "rerun"):
            assert signature(option(ps[cmd], name)) == signature(option(ps["run"], name)), (cmd, name)
    for name in ("--network", "--cc", "--set"):  # sweep takes lists of the same values
        assert option(ps["sweep"], name).dest == option(ps["run"], name).dest


def test_every_set_field_is_listed_in_each_commands_help() -> None:
    fields = [f for f in PacketConfig.__dataclass_fields__ if f != "cc_attrs"]
    for cmd in (*ONE_RUN, "sweep"):
        text = option(parsers()[cmd], "--set").help or ""
        missing = [f for f in fields if f not in text]
        assert not missing, (cmd, missing)
        assert "cc.ATTRIBUTE" in text and "phantora cc NAME" in text, cmd


def test_an_unknown_set_field_is_an_error_that_lists_the_fields(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["netsim", "-t", "star8", "-f", str(INCAST), "--network", "ns3", "--set", "bufer_bytes=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown PacketConfig field 'bufer_bytes'" in err and "buffer_bytes" in err and "Traceback" not in err


@pytest.mark.parametrize("cmd", [*ONE_RUN, "sweep"])
def test_an_unknown_cc_is_refused_by_every_command(
    cmd: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked against the library's registry before anything runs: one line naming the field and the known CCs."""
    (tmp_path / "x.py").write_text("print('never started')\n")
    argv = {
        "run": ["run", "-t", "star8", "--network", "ns3", "--cc", "cubic", str(tmp_path / "x.py")],
        "replay": ["replay", str(INCAST), "-t", "star8", "--network", "ns3", "--cc", "cubic"],
        "netsim": ["netsim", "-t", "star8", "-f", str(INCAST), "--network", "ns3", "--cc", "cubic"],
        "sweep": ["sweep", "-w", str(INCAST), "-t", "star8", "--cc", "dcqcn,cubic", "--dry-run"],
    }[cmd]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "unknown congestion control 'cubic' (registered: " in err and "dcqcn" in err and "swift" in err


@pytest.mark.parametrize("cmd", ONE_RUN)
def test_cc_and_packet_fields_with_the_flow_network_are_errors_on_every_command(
    cmd: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head, tail = {
        "run": (["run", "-t", "star8", "--nproc", "2"], [str(tmp_path / "never_started.py")]),
        "replay": (["replay", str(INCAST), "-t", "star8"], []),
        "netsim": (["netsim", "-t", "star8", "-f", str(INCAST)], []),
    }[cmd]
    for extra, field in ((["--cc", "dcqcn"], "--cc"), (["--set", "pfc=false"], "pfc")):
        assert main([*head, *extra, *tail]) == 2
        err = capsys.readouterr().err
        assert f"field '{field}'" in err and "applies to --network ns3 only" in err and "Traceback" not in err


def test_sweep_takes_cc_and_set_lists_as_axes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "-w", str(INCAST), "-t", "star8", "--network", "ns3", "--cc", "dcqcn,hpcc"]
    assert main([*argv, "--set", "buffer_bytes=1000000,4000000", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(" --network ns3" in ln for ln in lines)
    assert sum("--cc hpcc" in ln and "--set buffer_bytes=4000000" in ln for ln in lines) == 1
    with pytest.raises(SystemExit):
        main(["sweep", "-w", str(INCAST), "--network", "flow,packets", "--dry-run"])


def test_netsim_defaults_to_the_flow_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["netsim", "-t", "star8", "-f", str(INCAST), "-q"]) == 0
    out = capsys.readouterr().out
    assert "(flow, cc -)" in out and "nothing saved: pass --out DIR" in out  # without --out, it says so


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--topolgy", "twoleaf8", "train.py"], "unknown option --topolgy; did you mean --topology?"),
        (["run", "-t", "twoleaf8", "--nprc=2", "train.py"], "unknown option --nprc; did you mean --nproc?"),
        (["netsim", "-t", "star8", "--flws", "x"], "unknown option --flws; did you mean --flows?"),
        (["--verison"], "unknown option --verison; did you mean --version?"),
        (["run", "-t", "twoleaf8", "--xyzzy", "train.py"], "unknown option --xyzzy\n"),
    ],
)
def test_an_unknown_option_is_named_with_the_nearest_known_one(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "required" not in err


def test_the_scripts_own_options_and_abbreviations_are_not_unknown() -> None:
    """Everything after the script is the script's; a unique prefix (--topo) is argparse's abbreviation."""
    ns = build_parser().parse_args(["run", "--topo", "twoleaf8", "--nproc", "2", "train.py", "--lr", "3", "--xyz"])
    assert (ns.topology, ns.nproc, ns.script, ns.script_args) == ("twoleaf8", 2, "train.py", ["--lr", "3", "--xyz"])


def test_a_script_that_exits_through_argparse_keeps_its_message_and_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its usage and error, no SystemExit traceback, and its own exit code (argparse: 2) in phantora's error."""
    script = tmp_path / "strict.py"
    script.write_text("import argparse\nargparse.ArgumentParser(prog='strict.py').parse_args()\n")
    assert main(["run", "-q", "-t", "twoleaf8", "--nproc", "2", str(script), "--bogus"]) == 2
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "strict.py: error: unrecognized arguments: --bogus" in text
    assert "exited with code 2" in text and "exited with code 1" not in text
    assert "Traceback" not in text and "SystemExit" not in text


def test_a_one_step_summary_is_singular_and_step_0_is_explained() -> None:
    from phantora.results.summary import format_summary

    def summary(times: list[int]) -> dict[str, Any]:
        steps = [{"index": i, "time_ns": t, "compute_ns": t, "exposed_ns": 0} for i, t in enumerate(times)]
        steady = times[1:] or times
        st = {"mean": sum(steady) / len(steady), "steps_averaged": len(steady)}
        return {"world_size": 2, "gpu": "H100", "end_ns": sum(times), "steps": steps, "step_time_ns": st}

    one = format_summary(summary([2_000_000]))
    assert "step time (with set-up, 1 step): mean 2.000 ms" in one and "1 steps" not in one
    assert "run 2 steps or more" in one
    two = format_summary(summary([2_000_000, 1_000_000, 1_000_000]))
    assert "step time (steady, 2 steps): mean 1.000 ms" in two
    assert "step 0 counts from the run's start" in two


@pytest.mark.parametrize(
    ("var", "value"), [("PHANTORA_NCCL_HOST_LAUNCH", "maybe"), ("PHANTORA_GLOO_COST", "foo")]
)  # fmt: skip
def test_a_bad_rank_opt_in_is_one_line_from_the_launcher_before_any_rank_starts(
    var: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ranks' opt-in variables are checked by `phantora run` itself: a gloo cost would otherwise never be read
    in a run without gloo groups, and a bad host-launch value failed a rank mid-run."""
    from phantora.runtime import gloo_cost, nccl_launch

    monkeypatch.setenv(var, value)
    nccl_launch.enabled.cache_clear()
    gloo_cost.model.cache_clear()
    try:
        assert main(["run", "--topology", "testbed16", "--nproc", "2", "examples/cuda_ddp.py"]) == 2
    finally:
        nccl_launch.enabled.cache_clear()
        gloo_cost.model.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and var in err[0] and repr(value) in err[0]
