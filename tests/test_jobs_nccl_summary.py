"""A `--jobs` run's per-job results.json has `nccl`, NCCL's choices and the NCCL_* variables honoured, built as a
single run's (`summarize_choices` of the job's own collectives). Two live jobs whose programs force NCCL's algorithm
and protocol before creating their group (NCCL reads NCCL_ALGO / NCCL_PROTO when it tunes a communicator), one
Ring/Simple, the other Ring/LL: each job's three all-reduces are counted under its own choice only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phantora.collectives.nccl import nccl_env
from phantora.jobs.run import launch_jobs
from phantora.jobs.spec import parse_jobs
from phantora.launcher import RunConfig
from phantora.topology.generators import leaf_spine

SCRIPT = """
import os, sys, torch, torch.distributed as dist
os.environ.update(NCCL_ALGO="Ring", NCCL_PROTO=sys.argv[1])
dist.init_process_group("nccl")
for _ in range(3):
    dist.all_reduce(torch.ones(1 << 20))
dist.destroy_process_group()
"""


@pytest.mark.slow  # 2 live jobs of 2 ranks: 37 s wall at load 25-50 on the shared machine (as test_jobs_run.py's)
def test_each_jobs_results_count_nccls_choices_of_its_own_collectives(tmp_path: Path) -> None:
    (tmp_path / "ar.py").write_text(SCRIPT)
    body = "".join(
        f'[[job]]\nname = "{n}"\nscript = "ar.py"\nargs = "{proto}"\nranks = 2\nplacement = {p}\n'
        for n, p, proto in (("a", "[0, 2]", "Simple"), ("b", "[1, 3]", "LL"))
    )
    spec = parse_jobs(body, str(tmp_path / "jobs.toml"), tmp_path)
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="two-to-one")
    launch_jobs(spec, RunConfig(script="", topology=topo, out_dir=tmp_path / "out", trace="none"), alone=False)
    for name, proto in (("a", "Simple"), ("b", "LL")):
        doc = json.loads((tmp_path / "out" / "jobs" / name / "results.json").read_text())
        assert doc["nccl"]["choices"] == {"all_reduce": {f"Ring/{proto}": 3}}, doc.get("nccl")
        assert doc["nccl"]["program_env"] == [{"NCCL_ALGO": "Ring", "NCCL_PROTO": proto}]
        assert doc["nccl"]["env"] == dict(nccl_env(os.environ))  # the run's own: none set here


PLAIN = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
for _ in range(3):
    dist.all_reduce(torch.ones(1 << 20))
dist.destroy_process_group()
"""


@pytest.mark.slow  # 2 live jobs of 2 ranks, as above
def test_each_jobs_env_table_chooses_for_its_own_collectives(tmp_path: Path) -> None:
    """The same program in two jobs whose `env` tables force different protocols (docs/jobs.md): NCCL reads them
    when it tunes each job's communicator, so each job's all-reduces run its own, Ring/Simple and Ring/LL (before:
    both ran the run's defaults, the tables reaching the ranks but not NCCL's model), and each job's results.json
    names them as the NCCL_* it honoured."""
    (tmp_path / "ar.py").write_text(PLAIN)
    body = "".join(
        f'[[job]]\nname = "{n}"\nscript = "ar.py"\nranks = 2\nplacement = {p}\n'
        f'env = {{ NCCL_ALGO = "Ring", NCCL_PROTO = "{proto}" }}\n'
        for n, p, proto in (("a", "[0, 2]", "Simple"), ("b", "[1, 3]", "LL"))
    )
    spec = parse_jobs(body, str(tmp_path / "jobs.toml"), tmp_path)
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="two-to-one")
    launch_jobs(spec, RunConfig(script="", topology=topo, out_dir=tmp_path / "out", trace="none"), alone=False)
    docs = {n: json.loads((tmp_path / "out" / "jobs" / n / "results.json").read_text())["nccl"] for n in "ab"}
    assert {n: d["choices"] for n, d in docs.items()} == {
        "a": {"all_reduce": {"Ring/Simple": 3}},  # (NCCL's own choice here too: the LL job is the one that tells)
        "b": {"all_reduce": {"Ring/LL": 3}},
    }
    for name, proto in (("a", "Simple"), ("b", "LL")):
        assert docs[name]["env"] == {**dict(nccl_env(os.environ)), "NCCL_ALGO": "Ring", "NCCL_PROTO": proto}
        assert "program_env" not in docs[name]  # the program set none of its own
