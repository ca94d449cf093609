"""Every live rank, of one run or of a job among several, hears how to mark its collectives (`--set priority`,
`--set dlcp`): phantora.launcher.rank_options is the one place that tells it."""

from __future__ import annotations

from pathlib import Path

from phantora.jobs.run import _job_env
from phantora.jobs.spec import JobSpec
from phantora.launcher import RunConfig, rank_options
from phantora.netsim.cli_config import engine_spec_from_flags

MODEL = ("roofline", (), None)


def _cfg(network: str, *sets: str) -> RunConfig:
    return RunConfig("gpt_ddp.py", [], "testbed16", engine=engine_spec_from_flags(network, sets=list(sets)))


def test_a_single_run_passes_dlcp_and_priority_to_its_ranks(tmp_path: Path) -> None:
    env = rank_options(_cfg("ns3", "dlcp=grads", "dlcp_bound=0.05", "priority=layer"), "h100", tmp_path, MODEL,
                       False).to_env()  # fmt: skip
    assert env["PHANTORA_DLCP"] == "grads"
    assert float(env["PHANTORA_DLCP_BOUND"]) == 0.05
    assert env["PHANTORA_PRIORITY"] == "layer"


def test_each_live_job_gets_the_same_marks(tmp_path: Path) -> None:
    job = JobSpec(name="a", kind="script", source="gpt_ddp.py", ranks=2)
    env = _job_env(_cfg("ns3", "dlcp=grads", "dlcp_bound=0.02"), job, tmp_path, MODEL)
    assert env["PHANTORA_DLCP"] == "grads"
    assert float(env["PHANTORA_DLCP_BOUND"]) == 0.02


def test_the_flow_network_marks_nothing(tmp_path: Path) -> None:
    env = rank_options(_cfg("flow"), "h100", tmp_path, MODEL, False).to_env()
    assert "PHANTORA_DLCP" not in env
