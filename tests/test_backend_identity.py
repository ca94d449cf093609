"""A phantora rank's groups answer as a CUDA + NCCL rank's do (torch 2.13's distributed_c10d.py): `get_backend`
names the backend the program asked for, `init_process_group(device_id=...)` binds the device, and under that
eager init DeviceMesh splits the default group (`split_group`) into phantora groups with NCCL's timing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, HOST_CHANNEL_US, HOST_LAUNCH_US
from phantora.launcher import RunConfig, launch
from phantora.runtime.backend_name import cuda_config, cuda_name

SCRIPT = Path(__file__).resolve().parent / "scripts" / "backend_identity.py"
SIZE = 4 << 20  # the script's all-reduce: 1 Mi fp32
MiB = 1 << 20
# NCCL 2.29/2.30 src/graph/tuning.cc: baseLat[Ring][Simple] 8.4 µs, hwLat[NVLink][Ring][Simple] 3.4 µs a step
RING_SIMPLE_BASE_US, RING_SIMPLE_NVLINK_STEP_US = 8.4, 3.4
H100_NVLINK_GBS = 18 * 20.6  # src/graph/topo.h SM90_NVLINK_BW: 20.6 GB/s per NVLink4 link, 18 links an H100
CHANNELS = 24  # NCCL's ring channels on two H100s of one host (the published g2 log: RING/SIMPLE, channels 0..23)
CHUNK = 4 * (4 * MiB // 8)  # ALLREDUCE_CHUNKSTEPS (NCCL_STEPS / 2) steps of the 4 MiB Simple buffer's 8
PASS_US = 9.0  # one pass of a channel through its part (ring_kernel.py: fitted on the published H100 tables)


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


@pytest.mark.parametrize("asked", ["nccl", "NCCL", "cuda:nccl", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo"])
def test_the_config_is_torchs_backendconfig_of_the_request(asked: str) -> None:
    """`get_backend_config` prints torch's `BackendConfig` of the request (nccl: NCCL's devices, cuda; a
    device:backend string its own pairs), which this CPU build can make itself for these requests."""
    assert cuda_config(cuda_name(asked)) == str(dist.distributed_c10d.BackendConfig(dist.Backend(asked)))


def test_a_bare_requests_config_is_the_cuda_accelerators_default() -> None:
    """A bare request ("undefined"): BackendConfig takes the accelerator's device, cuda on a CUDA host, and its
    default backend (`default_device_backend_map["cuda"]`, nccl)."""
    assert cuda_config("undefined") == f"cuda:{dist.Backend.default_device_backend_map['cuda']}" == "cuda:nccl"


def test_nccl_with_a_device_id_answers_nccl_and_binds_the_device(eager: list[dict[str, Any]]) -> None:
    """`init_process_group("nccl", device_id=cuda:LOCAL_RANK)`: get_backend() is "nccl" and the default group's
    bound_device_id is the rank's GPU, so torch's eager-init branches (`_is_safe_to_split`) are taken."""
    for r, s in enumerate(eager):
        assert (s["backend"], s["bound"], s["safe_to_split"]) == ("nccl", f"cuda:{r}", True)


def test_the_groups_config_and_own_names_are_nccls(eager: list[dict[str, Any]]) -> None:
    """As ProcessGroupNCCL's: `get_backend_config()` "cuda:nccl" (torch's BackendConfig of "nccl"), and the group's
    `_get_backend_name()` and its cuda backend's `name()` "nccl", for the default group and a DeviceMesh split."""
    for s in eager:
        assert (s["config"], s["names"]) == ("cuda:nccl", ["nccl", "nccl"])
        assert (s["tp_config"], s["tp_names"]) == ("cuda:nccl", ["nccl", "nccl"])


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


def ring_all_reduce_ns(n: int, size: int) -> float:
    """A Simple ring all-reduce of `size` bytes on `n` H100s of one host, written out: NCCL's latency (base + one
    NVLink step per ring step, 2(n-1) steps), each GPU's 2(n-1)/n x size at its NVLink rate, the passes of a
    channel through its part (size / channels, nranks chunks a pass) and one slice (half a chunk) of the first
    pass at one channel's share of the NVLink as the fill."""
    lat_us = RING_SIMPLE_BASE_US + 2 * (n - 1) * RING_SIMPLE_NVLINK_STEP_US
    moved_ns = 2 * (n - 1) / n * size / H100_NVLINK_GBS
    passes = math.ceil(size / (CHANNELS * n * CHUNK))
    first_chunk = min(CHUNK, size / (CHANNELS * n))
    fill_ns = first_chunk / 2 / (H100_NVLINK_GBS / CHANNELS)
    return 1000 * (lat_us + passes * PASS_US) + moved_ns + fill_ns


def test_a_split_groups_all_reduce_sums_its_ranks_in_nccls_time(eager: list[dict[str, Any]]) -> None:
    """Each rank holds its rank: the tp sums are 0 + 1 and 2 + 3. The time is NCCL's ring for 2 GPUs of an H100
    host (testbed16), written out: 15.2 µs of latency, 4 MiB at 370.8 GB/s, one 9 µs pass and a 2.8 µs fill
    (38.34 µs; NCCL's tuner rates the Simple ring fastest here: 15.2 + 4 MiB / 360 GB/s = 26.9 µs, LL128 30.5),
    after the host's launch of the call (timed from a synchronise, the GPU idle: 4.26 µs + 24 work batches x 32 ns,
    nccl/host_launch.py's fit of nccl-tests, on by default since 39f211b9)."""
    want_ns = ring_all_reduce_ns(2, SIZE) + 1000 * (HOST_LAUNCH_US + HOST_CHANNEL_US * DEFAULT_BATCHES)
    for r, s in enumerate(eager):
        assert s["tp_sum"] == (1.0 if r < 2 else 5.0)
        assert s["tp_ns"] == pytest.approx(want_ns, abs=1)  # whole ns


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "name", "config"),
    [("pair", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"), ("bare", "undefined", "cuda:nccl")],
)
def test_other_requests_answer_their_own_names_unbound(tmp_path: Path, mode: str, name: str, config: str) -> None:
    """A "cpu:gloo,cuda:nccl" request answers that string, and that config; a bare init_process_group() "undefined"
    (torch's lazy init) and the CUDA accelerator's "cuda:nccl"; neither binds a device; the group calls itself
    "nccl" (its default backend type on a CUDA host either way)."""
    for s in run(tmp_path, mode):
        assert (s["backend"], s["bound"], s["config"], s["names"]) == (name, "None", config, ["nccl", "nccl"])
