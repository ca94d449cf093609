"""A phantora rank's groups answer as a CUDA + NCCL rank's do (torch 2.13's distributed_c10d.py): `get_backend`
names the backend the program asked for, `init_process_group(device_id=...)` binds the device, and under that
eager init DeviceMesh splits the default group (`split_group`) into phantora groups with NCCL's timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose
from phantora.launcher import RunConfig, launch, resolve_topology
from phantora.runtime.backend_name import cuda_name

SCRIPT = Path(__file__).resolve().parent / "scripts" / "backend_identity.py"
SIZE = 4 << 20  # the script's all-reduce: 1 Mi fp32


def run(tmp: Path, mode: str) -> list[dict[str, Any]]:
    seen = tmp / "seen"
    seen.mkdir()
    launch(RunConfig(str(SCRIPT), [str(seen), mode], "testbed16", nproc=4, tensors="real", trace="none",
                     out_dir=tmp / "run"))  # fmt: skip
    return [json.loads((seen / f"rank{r}.json").read_text()) for r in range(4)]


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run(tmp_path_factory.mktemp("eager"), "eager")


def test_torch_records_the_name_a_cuda_build_would() -> None:
    """torch stores the request's `Backend` string; a bare request is the device's default or "undefined"."""
    assert cuda_name("NCCL") == "nccl"
    assert cuda_name("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert cuda_name(None) == "undefined"
    assert cuda_name(None, 2) == cuda_name(None, "cuda:2") == "nccl"


def test_nccl_with_a_device_id_answers_nccl_and_binds_the_device(eager: list[dict[str, Any]]) -> None:
    """`init_process_group("nccl", device_id=cuda:LOCAL_RANK)`: get_backend() is "nccl" and the default group's
    bound_device_id is the rank's GPU, so torch's eager-init branches (`_is_safe_to_split`) are taken."""
    for r, s in enumerate(eager):
        assert (s["backend"], s["bound"], s["safe_to_split"]) == ("nccl", f"cuda:{r}", True)


def test_device_mesh_splits_the_default_group_into_nccl_groups(eager: list[dict[str, Any]]) -> None:
    """A (2, 2) mesh's "tp" groups are {0, 1} and {2, 3}, made by `split_group`: the default group was split
    once per mesh dimension (ProcessGroupNCCL's `comm_split_count`). Each is bound to the rank's GPU and answers
    "nccl"; so does new_group([0, 2]) under eager init."""
    for r, s in enumerate(eager):
        assert s["tp_ranks"] == [r - r % 2, r - r % 2 + 1]
        assert s["splits"] == 2
        assert (s["tp_backend"], s["tp_bound"]) == ("nccl", f"cuda:{r}")
    for r in (0, 2):
        assert (eager[r]["new_group_backend"], eager[r]["new_group_bound"]) == ("nccl", f"cuda:{r}")


def test_a_split_groups_all_reduce_sums_its_ranks_in_nccls_time(eager: list[dict[str, Any]]) -> None:
    """Each rank holds its rank: the tp sums are 0 + 1 and 2 + 3. The time is NCCL's for a 2-GPU ring on one
    host: its latency, the bytes over its algorithm bandwidth, and the pipeline fill."""
    topo = resolve_topology("testbed16")
    for r, s in enumerate(eager):
        assert s["tp_sum"] == (1.0 if r < 2 else 5.0)
        pair = (r - r % 2, r - r % 2 + 1)
        c = choose(Collective("all_reduce", pair, SIZE, "fp32"), topo, AlgoOptions())
        assert c is not None and c.algorithm == "ring"
        want_ns = 1000 * (c.lat_us + SIZE / (1000 * c.algbw) + c.fill_us)
        assert s["tp_ns"] == pytest.approx(want_ns, abs=1)  # whole ns


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "name"), [("pair", "cpu:gloo,cuda:nccl"), ("bare", "undefined")])
def test_other_requests_answer_their_own_names_unbound(tmp_path: Path, mode: str, name: str) -> None:
    """A "cpu:gloo,cuda:nccl" request answers that string; a bare init_process_group() "undefined" (torch's lazy
    init); neither binds a device."""
    for s in run(tmp_path, mode):
        assert (s["backend"], s["bound"]) == (name, "None")
