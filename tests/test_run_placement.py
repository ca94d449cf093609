"""`phantora run --placement`: a single run's ranks on the GPUs a user names (found in the CC user trial of
2026-12-05: 8 ranks on testbed16 fill host 0, so no byte reached a switch, and only a one-job `--jobs` file could
place them across the hosts)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.launcher import RunConfig, launch
from phantora.topology import load_topology
from phantora.topology.placement import place_run

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
x = torch.ones(1 << 16, device="cuda")
dist.all_reduce(x)
dist.destroy_process_group()
"""


def _names(topo, n: int) -> list[str]:
    return [topo.nodes[topo.node_of_rank(r)].name for r in range(n)]


def test_a_gpu_list_places_rank_r_on_its_rth_gpu() -> None:
    """ "0-3,8-11" on testbed16: ranks 0-3 on host 0's first four GPUs, ranks 4-7 on host 1's; the count is 8."""
    topo, n = place_run(load_topology("testbed16"), "0-3,8-11", None)
    assert n == 8
    assert _names(topo, 8) == ["gpu0", "gpu1", "gpu2", "gpu3", "gpu8", "gpu9", "gpu10", "gpu11"]
    topo, n = place_run(load_topology("testbed16"), "gpu8,gpu0", 2)  # ascending, whatever the list's order
    assert (n, _names(topo, 2)) == (2, ["gpu0", "gpu8"])


def test_spread_alternates_the_two_leaves_of_testbed16() -> None:
    """spread, 4 ranks: one GPU per leaf in turn (testbed16's leaves are its hosts) = GPUs 0, 8, 1, 9, ascending."""
    topo, n = place_run(load_topology("testbed16"), "spread", 4)
    assert (n, _names(topo, 4)) == (4, ["gpu0", "gpu1", "gpu8", "gpu9"])


@pytest.mark.parametrize(
    ("spec", "nproc", "message"),
    [
        ("0,8", 4, "2 GPUs listed for --nproc 4"),
        ("0,99", None, "GPU 99 is outside 'testbed16'"),
        ("gpu0,nic3", None, "no GPU named 'nic3'"),
        ("0,0", None, "listed twice"),
        ("packed", 17, "17 GPUs wanted, 16 free"),
    ],
)
def test_a_bad_placement_names_the_option(spec: str, nproc: int | None, message: str) -> None:
    with pytest.raises(InputError) as err:
        place_run(load_topology("testbed16"), spec, nproc)
    assert err.value.field == "--placement"
    assert message in str(err.value)


def test_spawn_and_jobs_refuse_it(tmp_path: Path) -> None:
    """--spawn runs on one host; --jobs places each job in its spec: both refuse --placement in one line."""
    with pytest.raises(InputError, match="no --placement"):
        launch(RunConfig(script=str(ROOT / "examples" / "gpt_ddp.py"), spawn=True, nproc=2, placement="0,8"))
    (tmp_path / "jobs.toml").write_text('[[job]]\nscript = "gpt_ddp.py"\nranks = 2\n')
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--placement", "0,8"]
    res = subprocess.run([*cmd, "--jobs", "jobs.toml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "each job's `placement`" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_two_ranks_on_the_two_hosts_cross_the_network(tmp_path: Path) -> None:
    """--placement 0,8: the all-reduce's flows run between gpu0 and gpu8 (by default GPUs 0 and 1, over NVLink)."""
    (tmp_path / "ar.py").write_text(SCRIPT)
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--no-progress"]
    res = subprocess.run(
        [*cmd, "--placement", "0,8", "--out", "out", "ar.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "out" / "flows.csv", newline="") as f:
        pairs = {(row["src"], row["dst"]) for row in csv.DictReader(f) if int(row["size_bytes"]) > 0}
    assert pairs == {("gpu0", "gpu8"), ("gpu8", "gpu0")}
