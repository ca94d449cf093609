"""Phantom mode (meta tensors) and rank deduplication, end to end through `phantora run`.

The references are independent runs of the same script: phantom mode runs the same ops on the
same shapes as real mode, so its simulated times must equal real mode's exactly; a deduplicated
SPMD job must give the simulated times of the same job with one live process per rank.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.errors import InputError
from phantora.launcher import RunConfig, launch, plan_processes
from phantora.topology.generators import leaf_spine, rail_optimized

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))


def two_leaves(n: int):
    """n GPUs on 2 leaves, 2:1 oversubscribed: cross-leaf rings contend."""
    return leaf_spine(2, n // 2, 1, nic_rate="100Gbps", latency="1us", oversubscription=2, name=f"two-leaves{n}")


def llama(topo, nproc: int, tensors: str, dedup: str = "off", *extra: str):
    args = ["--model", "tiny", "--seq", "64", "--batch", "2", "--steps", "2", "--dtype", "fp32", *extra]
    cfg = RunConfig(str(EXAMPLES / "llama_train.py"), args, topo, nproc=nproc, trace="none", timeout_s=300)
    cfg.tensors, cfg.dedup = tensors, dedup
    return launch(cfg)


def step_times(rep) -> list[int]:
    return [s["time_ns"] for s in rep.summary["steps"]]


# TP x FSDP (steady steps only) under -m slow for the suite's 15-minute budget; FSDP checks every figure
@pytest.mark.parametrize("parallel", [("fsdp",), pytest.param(("tp-fsdp", "--tp", "2"), marks=pytest.mark.slow)])
def test_phantom_run_times_equal_the_real_run(parallel: tuple[str, ...]) -> None:
    """Same ops, same shapes: the simulated steps, FLOPs and device memory are those of real mode.

    With tensor parallelism only the steady steps are compared: DTensor's set-up (its random-seed
    synchronisation reads values) runs differently in step 0."""
    topo = two_leaves(4)
    real = llama(topo, 4, "real", "off", "--parallel", *parallel)
    phantom = llama(topo, 4, "phantom", "off", "--parallel", *parallel)
    assert step_times(phantom)[1:] == step_times(real)[1:]
    if parallel[0] != "fsdp":
        return
    assert step_times(phantom) == step_times(real)
    assert phantom.summary["run"]["tensors"] == "phantom" and real.summary["run"]["tensors"] == "real"
    r0, p0 = real.summary["ranks"][0], phantom.summary["ranks"][0]
    assert p0["flops_by_dtype"] == r0["flops_by_dtype"] and p0["ops"] == r0["ops"]
    assert phantom.summary["memory"]["peak_bytes"] == real.summary["memory"]["peak_bytes"]
    assert "loss nan" in phantom.logs["rank 0"] and "loss nan" not in real.logs["rank 0"]


# FSDP alone under -m slow for the suite's budget: TP x FSDP is the harder case (TP groups must stay live). TP 2 x
# FSDP 2 on 4 ranks, 2 live, mirrors as TP 2 x FSDP 4 on 8 ranks, 4 live, did: one live TP group per shift, each
# FSDP group holding live ranks and their mirrors, across the two leaves (6 processes in place of 12)
@pytest.mark.parametrize(
    "parallel,world,live", [pytest.param(("fsdp",), 8, 2, marks=pytest.mark.slow), (("tp-fsdp", "--tp", "2"), 4, 2)]
)
def test_deduplicated_job_equals_one_process_per_rank(parallel: tuple[str, ...], world: int, live: int) -> None:
    """`world` ranks as `world` live processes, then as `live`: 8 as 2 (FSDP 8), 4 as 2 (TP 2 x FSDP 2)."""
    topo = two_leaves(world)
    extra = ("--parallel", *parallel)
    full = llama(topo, world, "phantom", "off", *extra)
    dedup = llama(topo, world, "phantom", str(live), *extra)
    assert full.summary["live_processes"] == world and dedup.summary["live_processes"] == live
    assert dedup.summary["world_size"] == world and len(dedup.cosim.ranks) == live
    assert step_times(dedup) == step_times(full)
    assert dedup.summary["tokens_per_s_per_gpu"] == pytest.approx(full.summary["tokens_per_s_per_gpu"])
    # the network carried every rank's flows, not only the live ranks'
    assert len(dedup.cosim.completions) == len(full.cosim.completions)


def test_dedup_that_breaks_the_tp_groups_is_refused() -> None:
    """TP groups of 2 cannot be mirrored by 1 live process: its TP group shifted by 1 overlaps itself."""
    with pytest.raises(BridgeError, match="not periodic in 1 ranks"):
        llama(two_leaves(4), 4, "phantom", "1", "--parallel", "tp-fsdp", "--tp", "2")


def phantom_failure(tmp_path: Path, name: str, body: str) -> str:
    """Run a 2-rank phantom script that must fail; the launcher's error text."""
    script = tmp_path / name
    script.write_text("import torch, torch.distributed as dist\ndist.init_process_group()\n" + textwrap.dedent(body))
    cfg = RunConfig(str(script), [], two_leaves(2), nproc=2, trace="none", timeout_s=120)
    cfg.tensors = "phantom"
    with pytest.raises(BridgeError) as info:
        launch(cfg)
    return str(info.value)


def test_data_dependent_value_in_phantom_mode_names_the_line(tmp_path: Path) -> None:
    text = phantom_failure(
        tmp_path,
        "branch.py",
        """
        x = torch.ones(4)
        print("float item", float(x.sum()), flush=True)   # NaN placeholder
        print("float list", x[:2].tolist(), flush=True)   # NaN placeholders
        if (x > 0).any():                                 # a branch on a value: refused
            print("unreachable")
        """,
    )
    assert "PhantomValueError" in text and "bool" in text and "branch.py:7" in text, text
    assert "float list [nan, nan]" in text, text
    text = phantom_failure(tmp_path, "index.py", "starts = torch.randint(0, 100, (4,))\nprint(starts.tolist())\n")
    assert "PhantomValueError" in text and "int64 tensor of shape [4]" in text and "index.py:4" in text, text


def test_process_plan() -> None:
    topo = leaf_spine(4, 8, 2, name="ls32")
    assert plan_processes(RunConfig("x.py", [], topo), topo) == (True, 32, 8)  # auto: phantom above 16, a host of 8
    assert plan_processes(RunConfig("x.py", [], topo, nproc=16), topo) == (False, 16, 16)
    cfg = RunConfig("x.py", [], topo, tensors="phantom", dedup="off")
    assert plan_processes(cfg, topo) == (True, 32, 32)
    with pytest.raises(InputError, match="phantom"):
        plan_processes(RunConfig("x.py", [], topo, tensors="real", dedup="4"), topo)
    with pytest.raises(InputError, match="divide"):
        plan_processes(RunConfig("x.py", [], topo, dedup="5"), topo)
    hosts4 = rail_optimized(8, gpus_per_host=4, spines=4, name="rail32x4")  # 8 live whatever a host's GPUs
    assert plan_processes(RunConfig("x.py", [], hosts4), hosts4) == (True, 32, 8)
    assert plan_processes(RunConfig("x.py", [], hosts4, nproc=4, tensors="phantom"), hosts4) == (True, 4, 4)
    assert plan_processes(RunConfig("x.py", [], hosts4, nproc=20, tensors="phantom"), hosts4) == (True, 20, 20)


DDP_SCRIPT = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import phantora.runtime as pr
dist.init_process_group()
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
ddp = DDP(mlp, bucket_cap_mb=1)
opt = torch.optim.AdamW(ddp.parameters())
for i in range(3):
    ddp(torch.randn(16, 1024)).sum().backward()
    opt.step()
    opt.zero_grad()
    pr.step()
"""


def test_ddp_runs_on_phantom_tensors_like_real_ones(tmp_path: Path) -> None:
    """DDP's buckets are rebuilt after the first step in both modes: same all-reduces, same steady step."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    reps = {}
    for tensors in ("real", "phantom"):
        cfg = RunConfig(str(script), [], two_leaves(2), nproc=2, trace="none", timeout_s=120)
        cfg.tensors = tensors
        reps[tensors] = launch(cfg)
    real, phantom = (reps[k].summary for k in ("real", "phantom"))
    assert phantom["ranks"][0]["comm"]["all_reduce"] == real["ranks"][0]["comm"]["all_reduce"]
    assert phantom["ranks"][0]["comm"]["all_reduce"]["count"] == 1 + 2 * 2  # one bucket, then two per step
    assert phantom["steps"][-1]["time_ns"] == real["steps"][-1]["time_ns"]


TP_SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
import phantora.runtime as pr
dist.init_process_group()
mesh = init_device_mesh("cpu", (2,))
mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
y = mlp(torch.randn(2048, 1024))   # the row-parallel output is all-reduced (a functional collective)
z = y + 1                          # consumes it: the compute lane must wait for the all-reduce
print("AFTER", pr.now(), flush=True)
pr.step()
"""


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_dtensor_all_reduce_is_waited_for_where_its_result_is_used(tmp_path: Path, tensors: str) -> None:
    script = tmp_path / "tp.py"
    script.write_text(TP_SCRIPT)
    cfg = RunConfig(str(script), [], two_leaves(2), nproc=2, trace="none", timeout_s=120)
    cfg.tensors = tensors
    rep = launch(cfg)
    after = int(rep.logs["rank 0"].split("AFTER ")[1].split()[0])
    ar = [c for c in rep.cosim.collectives if c["kind"] == "all_reduce"]
    assert len(ar) == 1 and ar[0]["end_ns"] > ar[0]["t_start"] > 0
    assert after >= dict(ar[0]["rank_done"])[0]


MESH_SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import phantora.runtime as pr
mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))  # no init_process_group first
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x, group=mesh["tp"].get_group())
dist.all_reduce(x, group=mesh["dp"].get_group())
torch.cuda.synchronize()
pr.step()
"""


def test_init_device_mesh_alone_starts_a_deduplicated_phantom_job(tmp_path: Path) -> None:
    """`init_device_mesh` without `init_process_group` (pytorch/examples' tensor_parallelism/fsdp_tp_example.py)
    initialises the default group itself, through the name torch.distributed.device_mesh imported: in phantom mode
    with fewer live processes than ranks it must take phantora's store, not torch's env:// rendezvous, whose rank 0
    waits for every rank of the world to connect (it hung there until the run's timeout)."""
    script = tmp_path / "mesh.py"
    script.write_text(MESH_SCRIPT)
    cfg = RunConfig(str(script), [], two_leaves(4), nproc=4, trace="none", timeout_s=90)
    cfg.tensors, cfg.dedup = "phantom", "2"
    rep = launch(cfg)
    assert rep.summary["world_size"] == 4 and rep.summary["live_processes"] == 2
    ars = sorted((c["group"], c["nbytes"], c["copies"]) for c in rep.cosim.collectives if c["kind"] == "all_reduce")
    # the tp groups {0, 1} and {2, 3} are one collective of 2 copies (live ranks 0 and 1 stand for 2 and 3); the dp
    # groups {0, 2} and {1, 3} one each; every one of them 1 Mi fp32 elements
    assert ars == [([0, 1], 4 << 20, 2), ([0, 2], 4 << 20, 1), ([1, 3], 4 << 20, 1)]
