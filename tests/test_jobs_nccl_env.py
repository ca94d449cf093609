"""A `--jobs` run's job `env` table sets NCCL_* for that job's collectives (docs/jobs.md), by the path a program's own
settings take (runtime/program_env.py): the launcher tells every rank the run's NCCL_* (`RUN_ENV`, what the
coordinator's model holds), a rank whose environment differs sends its own with each collective, and the model takes
those. Before, a rank compared against its own start-up environment, so a job's table never reached the model and the
job silently ran the run's defaults. The live run of two such jobs: tests/test_jobs_nccl_summary.py (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge.jobs import JobProcs
from bridge.run import CosimRun
from phantora.collectives.nccl import nccl_env
from phantora.errors import InputError
from phantora.jobs.run import launch_jobs
from phantora.jobs.spec import parse_jobs
from phantora.launcher import RunConfig
from phantora.runtime.program_env import RUN_ENV, at_start, program_nccl_env
from phantora.topology.generators import leaf_spine
from tests.test_program_nccl_env import _protocol

TOPO = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="two-to-one")


def _rank_sends(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[str, str], ...] | None:
    """What a rank started in `env` sends with its collectives when its program sets nothing."""
    for k, _ in nccl_env(os.environ):
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return program_nccl_env(at_start())


def test_a_jobs_env_table_reaches_nccls_model(monkeypatch: pytest.MonkeyPatch) -> None:
    forced = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    assert _protocol(None)[0] != "Simple"  # NCCL's own choice (LL at 64 KiB) differs, so Simple below is the table's
    jobs = [JobProcs("a", 2, ["x"]), JobProcs("b", 2, ["x"], {**forced, "MY_FLAG": "1"})]
    run = CosimRun(TOPO, jobs=jobs, env={"NCCL_MAX_NCHANNELS": "2"})  # a run-level setting both jobs hold
    common = run._common_env("ipc://x", "t", 1)
    assert run.spec.algo["nccl_env"] == (("NCCL_MAX_NCHANNELS", "2"),)
    assert json.loads(common[RUN_ENV]) == [["NCCL_MAX_NCHANNELS", "2"]]  # the model's: run.spec.algo
    # each job's rank environment as CosimRun builds it: the common one, overridden by the job's table
    assert _rank_sends({**common, **jobs[0].env}, monkeypatch) is None  # the run's: the model's own
    sent = _rank_sends({**common, **jobs[1].env}, monkeypatch)
    assert sent is not None and dict(sent) == {"NCCL_MAX_NCHANNELS": "2", **forced}
    protocol, rec = _protocol([list(kv) for kv in sent])
    assert (protocol, rec["nccl"]["algorithm"].lower()) == ("Simple", "ring")


def test_a_bad_value_in_a_jobs_env_table_is_one_line_naming_job_and_variable(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    body = '[[job]]\nname = "a"\nscript = "t.py"\nranks = 2\n\n[[job]]\nname = "b"\nscript = "t.py"\nranks = 2\n'
    spec = parse_jobs(body + 'env = { NCCL_PROTO = "LL2" }\n', str(tmp_path / "jobs.toml"), tmp_path)
    with pytest.raises(InputError) as err:
        launch_jobs(spec, RunConfig(script="", topology=TOPO, out_dir=tmp_path / "out"))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'jobs.toml'}:6: field 'env.NCCL_PROTO': job 'b': ")
    assert "'LL2'" in msg and not (tmp_path / "out").exists()
