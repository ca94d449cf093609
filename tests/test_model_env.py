"""config.json records the model switches a run read from its environment (results/model_env.py), and `phantora
rerun` restores them: set as they were, or unset, whatever the rerunning shell has."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.rank_options import Options
from phantora.results import model_env
from phantora.results.provenance import read_config

ROOT = Path(__file__).resolve().parents[1]
# PHANTORA_* names that are not model switches: the launcher sets them from the run's options (recorded as
# `options`), or they place, connect, cache or log the run without changing its simulated figures.
FROM_OPTIONS = set(Options(sim_cuda=True, trace_steps=1, out_dir="x", perf_tables=("t",), curves="c", start_ns=1,
                           max_steps=1, priority="layer", dlcp="grads", scenario="s").to_env())  # fmt: skip
PLUMBING = {
    "PHANTORA_NETWORK", "PHANTORA_BRIDGE_CURVE", "PHANTORA_BRIDGE_NETWORK", "PHANTORA_CACHE", "PHANTORA_CC_DIR",
    "PHANTORA_CURVE_CLIENTS", "PHANTORA_CUT_LOOP", "PHANTORA_ENDPOINT", "PHANTORA_HOST_PORT", "PHANTORA_JOB",
    "PHANTORA_LOG_DIR", "PHANTORA_NCCL_", "PHANTORA_NCCL_ENV", "PHANTORA_NETSIM_ENGINE", "PHANTORA_NS3_LIB",
    "PHANTORA_PEER_TIMEOUT_S", "PHANTORA_PYTHON", "PHANTORA_RECORD_DIR", "PHANTORA_REGISTER_CC", "PHANTORA_RUN_DIR",
    "PHANTORA_SHARED", "PHANTORA_STARTUP_TIMEOUT_S", "PHANTORA_TOKEN", "PHANTORA_TOPOLOGIES", "PHANTORA_TRACEBACK",
    "PHANTORA_WORKER_PROFILE", "PHANTORA_WRITE_PROCS", "PHANTORA_ZYGOTE",
}  # fmt: skip


def test_every_phantora_variable_in_the_source_is_a_recorded_switch_or_not_a_model_switch() -> None:
    """A new PHANTORA_* variable must be classified here: recorded in config.json, or said not to move figures."""
    names: set[str] = set()
    for d in ("phantora", "bridge"):
        for f in (ROOT / d).rglob("*.py"):
            names |= set(re.findall(r"\bPHANTORA_[A-Z][A-Z0-9_]*", f.read_text()))
    unknown = names - set(model_env.MODEL_SWITCHES) - FROM_OPTIONS - PLUMBING
    assert not unknown, f"classify {sorted(unknown)} in phantora/results/model_env.py or this test's PLUMBING"
    assert not set(model_env.MODEL_SWITCHES) & (FROM_OPTIONS | PLUMBING)


def test_the_record_names_every_switch_set_or_not_and_the_nccl_variables() -> None:
    shell = {"PHANTORA_HOST_COMPUTE": "off", "NCCL_ALGO": "Ring", "HOME": "/root", "PHANTORA_OUT": "x"}
    doc = model_env.recorded(shell)
    assert doc["PHANTORA_HOST_COMPUTE"] == "off" and doc["NCCL_ALGO"] == "Ring"
    assert doc["PHANTORA_NCCL_HOST_LAUNCH"] is None and doc["OMP_NUM_THREADS"] is None
    assert set(doc) == {*model_env.MODEL_SWITCHES, "OMP_NUM_THREADS", "NCCL_ALGO"}  # not HOME, not an option's
    with pytest.raises(InputError, match="model_env.*HOME"):
        model_env.check({"HOME": "/"}, "config.json")
    with pytest.raises(InputError, match="model_env"):
        model_env.check({"PHANTORA_HOST": 3}, "config.json")


def test_restoring_sets_the_recorded_values_unsets_the_rest_and_puts_the_shell_back() -> None:
    shell = {"PHANTORA_HOST_COMPUTE": "on", "NCCL_PROTO": "LL", "PHANTORA_HOST": "dgx-a100", "HOME": "/root"}
    env = dict(shell)
    doc = model_env.recorded({"PHANTORA_HOST_COMPUTE": "off", "NCCL_ALGO": "Tree"})
    with model_env.restored(doc, env):
        assert env == {"PHANTORA_HOST_COMPUTE": "off", "NCCL_ALGO": "Tree", "HOME": "/root"}
    assert env == shell


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phantora.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)  # fmt: skip


@pytest.mark.slow  # ~40 s: three live runs of examples/cpu_offload.py
def test_rerun_restores_the_host_compute_switch_the_run_had(tmp_path: Path) -> None:
    """A run with PHANTORA_HOST_COMPUTE=on (its host AdamW charged) is rerun from a shell that turns the model off:
    the rerun turns it on again and reproduces the steps exactly; a run with it off has other steps."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_HOST")}
    script = ROOT / "examples" / "cpu_offload.py"
    program = [str(script), "--offload", "--layers", "1", "--d-model", "256", "--heads", "4", "--seq", "32"]
    program += ["--batch", "2", "--steps", "3"]

    def args(out: str) -> list[str]:
        return ["run", "--topology", "testbed16", "--nproc", "2", "-q", "--out", str(tmp_path / out), *program]

    first = _run(args("on"), {**shell, "PHANTORA_HOST_COMPUTE": "on"}, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert read_config(tmp_path / "on")["model_env"]["PHANTORA_HOST_COMPUTE"] == "on"
    off_shell = {**shell, "PHANTORA_HOST_COMPUTE": "off"}
    again = _run(["rerun", str(tmp_path / "on"), "-q"], off_shell, tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "reproduced: the 3 simulated step times are identical" in again.stdout
    assert read_config(tmp_path / "on-rerun")["model_env"]["PHANTORA_HOST_COMPUTE"] == "on"
    off = _run(args("off"), off_shell, tmp_path)
    assert off.returncode == 0, off.stderr[-2000:]
    steps = [json.loads((tmp_path / d / "results.json").read_text())["steps"] for d in ("on", "off")]
    assert steps[0][-1]["time_ns"] > steps[1][-1]["time_ns"]  # the switch moves the step: the rerun had to restore it
