"""pytorch/examples' distributed programs, unchanged, under `phantora run` on 4 simulated H100s of testbed16.

The programs are vendored byte for byte (PROVENANCE.md). Each test runs one in a fresh working directory
and checks what its user would see on 4 GPUs: the run exits 0; the program reaches its own last line (the
examples exit 0 without training when they find too few GPUs, so the exit code alone proves nothing);
phantora reports one step per optimizer step with a finite, positive step time; and the program's own
output (checkpoints, snapshots) is written. The results are tabled in docs/runtime.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance import PROGRAMS, Run, assert_documented, git_blob_id, provenance_blobs, run_program, workdir_for

UPSTREAM = "pytorch-examples"
# fp32 attention: the memory-efficient kernel, torch's CUDA choice (flash takes fp16/bf16 only; sdp_choice.py)
EFFICIENT = "aten._scaled_dot_product_efficient_attention"


def ok(run: Run, last_line: str | None, steps: int) -> None:
    """Exit 0, the program's own last line (if it prints one), and `steps` optimizer steps with a steady step time."""
    assert run.returncode == 0, run.output[-3000:]
    if last_line is not None:
        assert last_line in run.log(0), run.log(0)[-3000:]
    assert len(run.steps()) == steps
    run.step_ms()


def test_vendored_programs_are_the_upstream_files() -> None:
    """Every vendored file is the upstream file PROVENANCE.md names (its git blob id), and nothing else is there."""
    blobs = provenance_blobs("pytorch/examples")
    root = PROGRAMS / UPSTREAM
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert present == set(blobs) and "LICENSE" in blobs
    for path, blob in blobs.items():
        assert git_blob_id(root / path) == blob, path


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """distributed/FSDP2/example.py as its README runs it (no flags): 10 steps of a 10-layer Transformer."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    return run_program(workdir_for(UPSTREAM, "distributed/FSDP2", tmp), "example.py", [], tmp / "out")


def test_fsdp2_example_trains_each_rank_on_its_own_gpu(fsdp2: Run) -> None:
    """DeviceMesh selects cuda:LOCAL_RANK because CUDA is not initialised yet (the example relies on it; with
    every rank on cuda:0 FSDP2 refuses the gradients); the full checkpoint is written at the end."""
    ok(fsdp2, None, steps=10)
    for rank in range(4):
        assert f"Running on rank {rank} on device cuda:{rank}" in fsdp2.log(rank)
    saved = sorted(p.name for p in (fsdp2.workdir / "checkpoints" / "dtensor_api").glob("*/*.pt"))
    assert saved == ["model_state_dict.pt", "optim_state_dict.pt"]
    assert_documented(fsdp2.step_ms(), "distributed/FSDP2/example.py", "no flags")


@pytest.mark.slow
def test_fsdp2_example_resumes_from_its_checkpoint(fsdp2: Run, tmp_path: Path) -> None:
    """A second run in the same directory loads the checkpoint (torch.load, distribute_tensor onto the mesh)
    instead of initialising. Loading the optimizer state calls `optim.step()` once (torch's
    `_init_optim_state`), so 11 steps; the last takes what the first run's last step took."""
    again = run_program(fsdp2.workdir, "example.py", [], tmp_path / "out")
    ok(again, None, steps=11)
    assert again.steps()[-1]["time_ns"] == pytest.approx(fsdp2.steps()[-1]["time_ns"], rel=0.01)
    assert len(list((fsdp2.workdir / "checkpoints" / "dtensor_api").iterdir())) == 2  # a second checkpoint


@pytest.mark.slow
def test_fsdp2_example_with_mixed_precision_and_explicit_prefetching(fsdp2: Run, tmp_path: Path) -> None:
    """bf16 parameters (fp32 reduction) with explicit prefetching: the program's own dtype checks pass, and a
    step is faster than the fp32 one (bf16 kernels, half the all-gather bytes)."""
    flags = ["--mixed-precision", "--explicit-prefetching"]
    run = run_program(workdir_for(UPSTREAM, "distributed/FSDP2", tmp_path), "example.py", flags, tmp_path / "out")
    ok(run, None, steps=10)
    assert run.step_ms() < 0.8 * fsdp2.step_ms()
    assert_documented(run.step_ms(), "distributed/FSDP2/example.py", "`--mixed-precision --explicit-prefetching`")


def test_tensor_parallel_example(tmp_path: Path) -> None:
    """distributed/tensor_parallelism/tensor_parallel_example.py: Colwise + Rowwise MLP over 4 ranks."""
    work = workdir_for(UPSTREAM, "distributed/tensor_parallelism", tmp_path)
    run = run_program(work, "tensor_parallel_example.py", [], tmp_path / "out")
    ok(run, "Tensor Parallel training completed!", steps=10)
    assert_documented(run.step_ms(), "distributed/tensor_parallelism/tensor_parallel_example.py", "as shipped")


def test_sequence_parallel_example(tmp_path: Path) -> None:
    """distributed/tensor_parallelism/sequence_parallel_example.py: sequence-sharded activations."""
    work = workdir_for(UPSTREAM, "distributed/tensor_parallelism", tmp_path)
    run = run_program(work, "sequence_parallel_example.py", [], tmp_path / "out")
    ok(run, "Sequence Parallel training completed!", steps=10)
    assert_documented(run.step_ms(), "distributed/tensor_parallelism/sequence_parallel_example.py", "as shipped")


@pytest.fixture(scope="module")
def fsdp_tp_phantom(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """distributed/tensor_parallelism/fsdp_tp_example.py in phantom mode (shapes only: seconds, not minutes)."""
    tmp = tmp_path_factory.mktemp("fsdp-tp")
    work = workdir_for(UPSTREAM, "distributed/tensor_parallelism", tmp)
    return run_program(work, "fsdp_tp_example.py", [], tmp / "out", options=("--phantom",))


def efficient_per_layer_and_step(run: Run) -> None:
    """Attention (fp32) is one memory-efficient kernel per layer (2) and step (10), forward and backward."""
    ok(run, "2D training successfully completed!", steps=10)
    kernels = run.kernels(0)
    assert kernels.count(EFFICIENT) == 2 * 10 and kernels.count(f"{EFFICIENT}_backward") == 2 * 10


def test_fsdp_tp_example_in_phantom_mode(fsdp_tp_phantom: Run) -> None:
    """A 2-layer Llama 2, TP 2 x FSDP 2. Its attention is F.scaled_dot_product_attention on head-sharded
    DTensors, run as DTensor's rule for the fused op torch chooses says (fp32: memory-efficient attention)."""
    efficient_per_layer_and_step(fsdp_tp_phantom)
    assert_documented(
        fsdp_tp_phantom.step_ms(), "distributed/tensor_parallelism/fsdp_tp_example.py", "as shipped, `--phantom`"
    )


@pytest.mark.slow
def test_fsdp_tp_example_runs_attention_as_the_efficient_kernel(fsdp_tp_phantom: Run, tmp_path: Path) -> None:
    """The same in real mode (the values computed): the same kernels, and the steady step time of phantom mode."""
    work = workdir_for(UPSTREAM, "distributed/tensor_parallelism", tmp_path)
    run = run_program(work, "fsdp_tp_example.py", [], tmp_path / "out")
    efficient_per_layer_and_step(run)
    assert run.step_ms() == pytest.approx(fsdp_tp_phantom.step_ms(), rel=1e-3)
    assert_documented(run.step_ms(), "distributed/tensor_parallelism/fsdp_tp_example.py", "as shipped (TP 2")


def test_ddp_example(tmp_path: Path) -> None:
    """distributed/ddp/example.py: torch.accelerator picks the backend and device; DDP moves the CPU input."""
    run = run_program(workdir_for(UPSTREAM, "distributed/ddp", tmp_path), "example.py", [], tmp_path / "out")
    assert run.returncode == 0, run.output[-3000:]
    for rank in range(4):
        assert f"training completed in rank {rank}!" in run.log(rank)
        assert f"world_size = 4, rank = {rank}" in run.log(rank)
    assert len(run.steps()) == 1 and run.steps()[0]["time_ns"] > 0
    assert_documented(run.steps()[0]["time_ns"] / 1e6, "distributed/ddp/example.py", "as shipped")


@pytest.fixture(scope="module")
def ddp_tutorial(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """distributed/ddp-tutorial-series/multigpu_torchrun.py, 2 epochs, a snapshot every epoch."""
    tmp = tmp_path_factory.mktemp("ddp-tutorial")
    work = workdir_for(UPSTREAM, "distributed/ddp-tutorial-series", tmp)
    return run_program(work, "multigpu_torchrun.py", ["2", "1"], tmp / "out")


def test_ddp_tutorial_series_multigpu_torchrun(ddp_tutorial: Run) -> None:
    """2048 samples, batch 32 per rank over 4 ranks: 16 steps per epoch, 32 in all; rank 0 saves snapshots."""
    ok(ddp_tutorial, "Epoch 1 | Training snapshot saved at snapshot.pt", steps=32)
    assert (ddp_tutorial.workdir / "snapshot.pt").stat().st_size > 0
    assert_documented(ddp_tutorial.step_ms(), "distributed/ddp-tutorial-series/multigpu_torchrun.py", "`2 1`")


def test_ddp_tutorial_series_resumes_from_its_snapshot(ddp_tutorial: Run, tmp_path: Path) -> None:
    """A second run loads the snapshot with torch.load(map_location="cuda:N") (rank 0 saved it from its GPU:
    simulated-GPU tensors are saved as a GPU saves them) and trains from the epoch the snapshot names (its
    `EPOCHS_RUN` is the last epoch saved, 1, which the program runs again) to 3: epochs 1 and 2, 32 steps, each
    as long as the first run's."""
    again = run_program(ddp_tutorial.workdir, "multigpu_torchrun.py", ["3", "1"], tmp_path / "out")
    ok(again, "Resuming training from snapshot at Epoch 1", steps=32)
    assert "Epoch 0 |" not in again.log(0)
    assert "Epoch 2 | Training snapshot saved at snapshot.pt" in again.log(0)
    assert again.step_ms() == pytest.approx(ddp_tutorial.step_ms(), rel=0.01)


@pytest.mark.slow
def test_ddp_tutorial_series_multinode_one_gpu_a_host(ddp_tutorial: Run, tmp_path: Path) -> None:
    """distributed/ddp-tutorial-series/multinode.py (the series' torchrun multi-node version: LOCAL_RANK for the
    device, RANK for the snapshot writer) on 4 hosts of twoleaf8 with one GPU each: every rank is cuda:0 of its
    own host and rank 0 saves; 16 steps an epoch as on one host, each longer than on one host (the gradient
    all-reduce crosses the hosts' 100 Gb/s links instead of NVLink)."""
    work = workdir_for(UPSTREAM, "distributed/ddp-tutorial-series", tmp_path)
    run = run_program(work, "multinode.py", ["2", "1"], tmp_path / "out", 4, ("--topology", "twoleaf8"))
    ok(run, "Epoch 1 | Training snapshot saved at snapshot.pt", steps=32)
    for rank in range(4):
        assert f"[GPU{rank}] Epoch 1 | Batchsize: 32 | Steps: 16" in run.log(rank)
    assert run.step_ms() > ddp_tutorial.step_ms()
    assert_documented(run.step_ms(), "distributed/ddp-tutorial-series/multinode.py", "`2 1`")


@pytest.mark.slow
def test_ddp_tutorial_series_multigpu_spawn(ddp_tutorial: Run, tmp_path: Path) -> None:
    """distributed/ddp-tutorial-series/multigpu.py starts a process per GPU itself (torch.multiprocessing.spawn, as
    many as torch.cuda.device_count()). Under `phantora run --spawn --nproc 4` it runs once, on a host of 4 GPUs, and
    its 4 processes are the ranks: 2048 samples, batch 32 a rank, 16 steps an epoch, 32 in all; rank 0 alone writes
    checkpoint.pt after each epoch. Its model, data and batch are multigpu_torchrun.py's: so is its step time."""
    work = workdir_for(UPSTREAM, "distributed/ddp-tutorial-series", tmp_path)
    run = run_program(work, "multigpu.py", ["2", "1"], tmp_path / "out", 4, ("--spawn",))
    ok(run, "Epoch 1 | Training checkpoint saved at checkpoint.pt", steps=32)
    assert run.results()["run"]["world_size"] == 4
    for rank in range(4):
        assert f"[GPU{rank}] Epoch 1 | Batchsize: 32 | Steps: 16" in run.log(rank)
        assert ("Training checkpoint saved" in run.log(rank)) == (rank == 0)
    assert (work / "checkpoint.pt").stat().st_size > 0
    assert run.step_ms() == pytest.approx(ddp_tutorial.step_ms(), rel=0.01)
    assert_documented(run.step_ms(), "distributed/ddp-tutorial-series/multigpu.py", "`2 1`, `--spawn")


@pytest.mark.slow
def test_ddp_tutorial_series_multigpu_without_spawn_stops_in_one_line(tmp_path: Path) -> None:
    """Without --spawn, phantora starts the program as one rank and the processes it starts run outside phantora:
    the first CUDA call in one ends the run on one line naming the program's mp.spawn call and `--spawn`."""
    work = workdir_for(UPSTREAM, "distributed/ddp-tutorial-series", tmp_path)
    run = run_program(work, "multigpu.py", ["2", "1"], tmp_path / "out", 1)
    assert run.returncode != 0
    last = run.output.strip().splitlines()[-1]
    assert "multigpu.py:104" in last and "NotSimulatedError: `mp.spawn(main, args=(world_size" in last
    assert "started processes of its own" in last and "phantora run --spawn --nproc N script.py" in last
