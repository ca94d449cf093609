"""End-to-end runs of real training scripts through the co-simulation bridge (`phantora run`).

Each test starts real rank processes (torch + gloo + the bridge), so they use 2-4 ranks and tiny models.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bridge.errors import BridgeError
from bridge.supervisor import alive_pids
from phantora.launcher import RunConfig, launch
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GPT_ARGS = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32", "--batch", "2"]


def star(n: int, nic: str = "100Gbps"):
    """n GPUs on one switch, 1 us links."""
    return leaf_spine(1, n, 0, nic_rate=nic, latency="1us", name=f"star{n}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOO_EXIT_ABORT = "terminate called without an active exception"  # torch's gloo threads at interpreter exit


def run_gloo(script: Path, args: list[str], world: int, timeout: float = 240) -> list[str]:
    """The same script as plain torch.distributed processes on gloo (no phantora); returns rank outputs.

    torch 2.13's gloo sometimes aborts a process at interpreter exit, after its work is done; such a reference
    run is run once more (the reference, not phantora, failed)."""
    outs, codes = _gloo_once(script, args, world, timeout)
    if any(c != 0 and GLOO_EXIT_ABORT in o for c, o in zip(codes, outs, strict=True)):
        outs, codes = _gloo_once(script, args, world, timeout)
    assert all(c == 0 for c in codes), outs
    return outs


def _gloo_once(script: Path, args: list[str], world: int, timeout: float) -> tuple[list[str], list[int]]:
    port = str(_free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1")
        env["MASTER_PORT"] = port
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outs = [p.communicate(timeout=timeout)[0].decode() for p in procs]
    return outs, [p.returncode for p in procs]


def losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", log)]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_ddp_real_mode_equals_gloo(tmp_path):
    """2 ranks, one DDP step: gradients and parameters equal those of the same script on gloo. (Each rank's
    gradients are the mean of both ranks' own, so 2 ranks check the bucketed all-reduce's data as 4 did; the real
    data of more ranks: tests/test_examples_zoo.py's 4-rank TP x FSDP2 and EP sub-group runs.)"""
    script = EXAMPLES / "gpt_ddp.py"
    run_gloo(script, [*GPT_ARGS, "--steps", "1", "--save", str(tmp_path / "gloo")], 2)
    rep = launch(
        RunConfig(
            str(script), [*GPT_ARGS, "--steps", "1", "--save", str(tmp_path / "sim")], star(2), nproc=2, timeout_s=300
        )
    )
    for r in range(2):
        want, got = np.load(tmp_path / f"gloo.rank{r}.npz"), np.load(tmp_path / f"sim.rank{r}.npz")
        assert sorted(want.files) == sorted(got.files) and any(k.startswith("grad/") for k in want.files)
        for k in want.files:
            torch.testing.assert_close(torch.from_numpy(got[k]), torch.from_numpy(want[k]), msg=k)
    s = rep.summary
    assert len(s["steps"]) == 1 and s["steps"][0]["time_ns"] > 0
    assert all(rk["comm"]["all_reduce"]["count"] >= 1 for rk in s["ranks"])


OVERLAP = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import phantora.runtime as pr
    D, L, B = 1024, 4, 1024
    dist.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(D, D, bias=False) for _ in range(L)])
    ddp = DDP(model, bucket_cap_mb=4)  # one 4 MiB bucket per layer
    x = torch.randn(B, D)
    for _ in range(2):  # step 0 builds DDP's buckets; step 1 is measured
        ddp(x).sum().backward()
        pr.step()
    dist.destroy_process_group()
"""


def test_ddp_overlaps_backward_with_bucket_all_reduces(tmp_path):
    """One DDP step: max(compute, comm) <= step < compute + comm. (That two live runs give the same steps:
    tests/test_forkserver.py's forked and fresh runs of examples/gpt_ddp.py, the same steps and losses.)"""
    script = write(tmp_path, "overlap.py", OVERLAP)
    topo = star(2, nic="400Gbps")
    cfg = RunConfig(str(script), topology=topo, nproc=2, trace="none", timeout_s=300, compute_model="roofline")
    s = launch(cfg).summary
    step = s["steps"][1]
    d, layers, b = 1024, 4, 1024
    # compute: 3 matmuls per layer (forward, grad input, grad weight), roofline on H100 fp32 (67 TFLOP/s)
    matmul_ns = 3 * layers * 2 * b * d * d / 67e12 * 1e9
    assert matmul_ns <= step["compute_ns"] <= 1.25 * matmul_ns
    # comm: ring all-reduce of one 4 MiB bucket per layer, 2(n-1)/n * S / B with n = 2 at 400 Gb/s
    comm_ns = layers * (2 * (2 - 1) / 2) * (4 * 2**20) * 8 / 400e9 * 1e9
    assert max(step["compute_ns"], comm_ns) <= step["time_ns"] < step["compute_ns"] + comm_ns
    assert all(rk["comm"]["all_reduce"]["count"] == 1 + layers for rk in s["ranks"])  # 1 bucket at first


COVERAGE = """
    import torch, torch.distributed as dist
    import phantora.runtime as pr
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    def check(name, got, want):
        assert torch.equal(got, want), (name, got, want)
    sub = dist.new_group([0, 1])                      # a subgroup with its own phantora group
    t = torch.full((3,), float(r + 1)); dist.all_reduce(t, group=sub); check("all_reduce/sub", t, torch.full((3,), 3.0))
    t = torch.full((2,), float(r)); dist.all_reduce(t, op=dist.ReduceOp.AVG); check("avg", t, torch.full((2,), 0.5))
    t = torch.full((2,), float(r)); dist.broadcast(t, src=1); check("broadcast", t, torch.ones(2))
    t = torch.full((2,), float(r + 1)); dist.reduce(t, dst=0)
    if r == 0: check("reduce", t, torch.full((2,), 3.0))
    outs = [torch.empty(2) for _ in range(n)]; dist.all_gather(outs, torch.full((2,), float(r)))
    check("all_gather", torch.cat(outs), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    out = torch.empty(1); dist.reduce_scatter(out, [torch.full((1,), float(r + j)) for j in range(n)])
    check("reduce_scatter", out, torch.full((1,), float(1 + 2 * r)))
    out = torch.empty(2); dist.all_to_all_single(out, torch.tensor([10.0 * r, 10.0 * r + 1]))
    check("a2a even", out, torch.tensor([float(r), 10.0 + r]))
    send = torch.arange(3.0) + 10 * r                   # rank 0 sends [0] to 0, [1, 2] to 1; rank 1 sends [10, 11] to 0
    in_s, out_s = ([1, 2], [1, 2]) if r == 0 else ([2, 1], [2, 1])
    send = send[: sum(in_s)]
    out = torch.empty(sum(out_s)); dist.all_to_all_single(out, send, out_s, in_s)
    check("a2a uneven", out, torch.tensor([0.0, 10.0, 11.0]) if r == 0 else torch.tensor([1.0, 2.0, 12.0]))
    outs = [torch.empty(1) for _ in range(n)]; dist.all_to_all(outs, [torch.full((1,), 10.0 * r + j) for j in range(n)])
    check("a2a list", torch.cat(outs), torch.tensor([float(r), 10.0 + r]))
    g = [torch.empty(2) for _ in range(n)] if r == 1 else None
    dist.gather(torch.full((2,), float(r)), g, dst=1)
    if r == 1: check("gather", torch.cat(g), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    out = torch.empty(2); dist.scatter(out, [torch.full((2,), 5.0 + j) for j in range(n)] if r == 0 else None, src=0)
    check("scatter", out, torch.full((2,), 5.0 + r))
    if r == 0:
        dist.send(torch.tensor([42.0]), dst=1, tag=7)
    else:
        t = torch.empty(1); dist.recv(t, src=0, tag=7); check("send/recv", t, torch.tensor([42.0]))
    peer = 1 - r
    box = torch.empty(1)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([float(r)]), peer),
                                   dist.P2POp(dist.irecv, box, peer)])
    for q in reqs:
        q.wait()
    check("batch p2p", box, torch.tensor([float(peer)]))
    dist.barrier()
    pr.step()
    if r == 0:
        print("COVERAGE OK", flush=True)
    dist.destroy_process_group()
"""


def test_every_collective_moves_the_right_data(tmp_path):
    """Each collective kind, a subgroup, p2p and batched p2p give the closed-form values across 2 ranks."""
    script = write(tmp_path, "coverage.py", COVERAGE)
    rep = launch(RunConfig(str(script), topology=star(2), nproc=2, trace="none", timeout_s=240))
    assert "COVERAGE OK" in rep.logs["rank 0"], rep.logs["rank 0"][-2000:]
    comm = rep.summary["ranks"][0]["comm"]
    for kind in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather"):
        assert comm[kind]["count"] >= 1, kind
    assert comm["scatter"]["count"] == 1 and comm["send"]["count"] == 2 and comm["barrier"]["count"] >= 1


MISMATCH = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    n = 4 if dist.get_rank() == 0 else 8   # rank 1 reduces a tensor twice as big
    dist.all_reduce(torch.ones(n))
    dist.destroy_process_group()
"""


def test_mismatched_collectives_stop_with_the_bridge_diagnostic(tmp_path):
    script = write(tmp_path, "mismatch.py", MISMATCH)
    t0 = time.monotonic()
    with pytest.raises(BridgeError) as info:
        launch(RunConfig(str(script), topology=star(2), nproc=2, timeout_s=120))
    text = str(info.value)
    assert "mismatch" in text and "16 B" in text and "32 B" in text, text
    assert time.monotonic() - t0 < 100


CRASH = """
    import os, sys, time, torch, torch.distributed as dist
    out = sys.argv[1]
    dist.init_process_group()
    rank = dist.get_rank()
    with open(f"{out}/pid{rank}", "w") as f:
        f.write(str(os.getpid()))
    dist.barrier()
    if rank == 1:
        with open(f"{out}/raised", "w") as f:
            f.write(repr(time.monotonic()))
        raise ValueError("boom from rank one")
    while True:                      # rank 0 keeps training and waiting on collectives
        dist.all_reduce(torch.ones(4))
"""


def test_exception_in_one_rank_ends_the_run(tmp_path):
    script = write(tmp_path, "crash.py", CRASH)
    with pytest.raises(BridgeError) as info:
        launch(RunConfig(str(script), [str(tmp_path)], topology=star(2), nproc=2, timeout_s=120))
    ended = time.monotonic()
    raised = float((tmp_path / "raised").read_text())
    assert ended - raised < 5.0
    text = str(info.value)
    assert "rank 1" in text and "ValueError: boom from rank one" in text and "crash.py" in text, text
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert alive_pids(pids) == []


LOADER = """
    import os, torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.full((4,), float(i * i)), os.getpid()

    dist.init_process_group()
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=60)
    total, pids = torch.zeros(1), set()
    for x, pid in loader:
        total += x.sum()
        pids |= set(pid.tolist())
    dist.all_reduce(total)
    print(f"total {total.item():.0f} workers {len(pids - {os.getpid()})}")
"""


def test_dataloader_workers_run_as_plain_host_processes(tmp_path):
    """Workers the rank forks build batches with plain torch: no charging, no bridge (which hung them)."""
    script = write(tmp_path, "loader.py", LOADER)
    rep = launch(RunConfig(str(script), topology=star(2), nproc=2, trace="none", timeout_s=120))
    want = 2 * 4 * sum(i * i for i in range(16))  # 2 ranks x 4 elements x sum of squares
    for r in range(2):
        assert f"total {want} workers 2" in rep.logs[f"rank {r}"]


def gpt_config(script: str) -> RunConfig:
    """examples/`script` at its default size, 2 steps on 2 ranks, real tensors."""
    return RunConfig(str(EXAMPLES / script), ["--steps", "2"], star(2), nproc=2, trace="none", timeout_s=300)


@pytest.fixture(scope="module")
def gpt_real() -> dict[str, Any]:
    """The GPT examples' real-mode runs (DDP, FSDP2), each run once: the FSDP2-against-DDP check and the
    phantom-tensor check read the same runs."""
    return {script: launch(gpt_config(script)) for script in ("gpt_ddp.py", "gpt_fsdp.py")}


def test_fsdp2_example_matches_ddp_losses(gpt_real: dict[str, Any]) -> None:
    """FSDP2 (all-gather + reduce-scatter on the phantora backend) trains exactly like DDP."""
    fsdp, ddp = gpt_real["gpt_fsdp.py"], gpt_real["gpt_ddp.py"]
    lf, ld = losses(fsdp.logs["rank 0"]), losses(ddp.logs["rank 0"])
    assert len(lf) == 2 and lf == pytest.approx(ld, rel=1e-4)
    comm = fsdp.summary["ranks"][0]["comm"]
    assert comm["all_gather"]["count"] > 0 and comm["reduce_scatter"]["count"] > 0
    assert fsdp.summary["tokens_per_s_per_gpu"] > 0 and 0 < fsdp.summary["mfu"] < 1


@pytest.mark.parametrize("script", ["gpt_ddp.py", "gpt_fsdp.py"])
def test_gpt_examples_run_on_phantom_tensors(gpt_real: dict[str, Any], script: str) -> None:
    """The GPT examples read their batches on the host and move them to the model's device, so they
    also run in phantom mode (`phantora run`'s default above 16 ranks), loss a NaN placeholder. Their
    steps match real mode's to within the host-side batch assembly, which real mode (CPU tensors
    are the device there) charges as device ops: a few microseconds of a ~1 ms step."""
    cfg = gpt_config(script)
    cfg.tensors = "phantom"
    phantom, real = launch(cfg), gpt_real[script]
    assert phantom.summary["run"]["tensors"] == "phantom" and "loss nan" in phantom.logs["rank 0"]
    assert all(not math.isnan(v) for v in losses(real.logs["rank 0"]))
    p, r = ([s["time_ns"] for s in rep.summary["steps"]] for rep in (phantom, real))
    assert p == pytest.approx(r, rel=0.01)


def test_tp_example_matches_single_process_training():
    """DTensor tensor parallelism (functional collectives) gives the losses of the unsharded model."""
    steps, layers, d, hidden, tokens, lr = 2, 2, 32, 64, 16, 0.1
    args = ["--steps", str(steps), "--layers", str(layers), "--d-model", str(d), "--hidden", str(hidden)]
    args += ["--tokens", str(tokens), "--lr", str(lr)]
    rep = launch(RunConfig(str(EXAMPLES / "tp_mlp.py"), args, star(2), nproc=2, trace="none", timeout_s=300))
    sys.path.insert(0, str(EXAMPLES))
    try:
        from tp_mlp import MLP
    finally:
        sys.path.remove(str(EXAMPLES))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(MLP(d, hidden) for _ in range(layers)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    want = []
    for _ in range(steps):
        x = torch.randn(tokens, d, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert losses(rep.logs["rank 0"]) == pytest.approx(want, abs=2e-5)
    # per step: each layer's forward all-reduces its output; each backward but the first layer's its input grad
    assert rep.summary["ranks"][0]["comm"]["all_reduce"]["count"] == (2 * layers - 1) * steps


@pytest.mark.ns3
@pytest.mark.slow  # ~20 s; tests/test_run_cosim.py runs a live ns-3 job by default
def test_ddp_example_runs_in_ns3_mode(tmp_path):
    args = [*GPT_ARGS, "--steps", "2"]
    rep = launch(
        RunConfig(
            str(EXAMPLES / "gpt_ddp.py"),
            args,
            star(2),
            engine=engine_spec_from_flags("ns3", cc="dcqcn"),
            nproc=2,
            out_dir=tmp_path,
            timeout_s=600,
        )  # fmt: skip
    )
    s = rep.summary
    assert s["run"]["network"] == "ns3" and len(s["steps"]) == 2
    assert all(st["time_ns"] >= st["compute_ns"] > 0 for st in s["steps"])
    assert (tmp_path / "results.json").is_file() and (tmp_path / "trace.json").is_file()
