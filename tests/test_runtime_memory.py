"""Simulated device memory (phantora/runtime/memory.py), checked against closed forms.

Every figure is computed by hand from tensor shapes: fp32 is 4 bytes, and every storage is rounded
up to the CUDA caching allocator's 512-byte block. A session without the bridge (no-network
client) and the charging dispatch mode are enough; no process is started.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import phantora.runtime as pr
from phantora.errors import InputError
from phantora.perfmodel.gpus import get_gpu
from phantora.results.summary import format_summary, summarize
from phantora.runtime import session as _session
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.memory import MemoryTracker, active
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.units import parse_size_bytes

MIB = 1 << 20


def up(n: int) -> int:
    """n bytes rounded up to the allocator's 512-byte block."""
    return -(-n // 512) * 512


def new_session(monkeypatch: pytest.MonkeyPatch | None = None, **env: str) -> RankSession:
    if monkeypatch is not None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    return RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")


def bd(s: RankSession) -> dict[str, int]:
    return s.memory.breakdown()


def test_linear_adamw_one_step_closed_form():
    s = new_session()
    n_params = 1024 * 1024 + 1024
    p_bytes = 4 * n_params  # both storages are multiples of 512
    with ChargeMode(s):
        model = nn.Linear(1024, 1024)
        assert bd(s)["parameters"] == p_bytes
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(8, 1024)
        model(x).sum().backward()
        assert bd(s)["gradients"] == p_bytes
        opt.step()
        m = bd(s)
    assert m["parameters"] == p_bytes
    assert m["gradients"] == p_bytes
    # exp_avg and exp_avg_sq per parameter, plus one 4-byte `step` scalar per parameter (2 of them)
    assert m["optimizer"] == 2 * p_bytes + 2 * up(4)
    # the peak is inside the step: its breakdown holds the optimizer state, not "temporaries"
    peak = s.memory.breakdown(s.memory.peak_by_cat)
    assert peak["optimizer"] == 2 * p_bytes + 2 * up(4)
    assert s.memory.peak == sum(peak.values()) >= s.memory.current
    opt.zero_grad(set_to_none=True)
    assert bd(s)["gradients"] == 0


def test_mlp_activations_are_the_saved_tensors():
    s = new_session()
    b, d_in, d_h, d_out = 3, 64, 100, 32
    with ChargeMode(s):
        mlp = nn.Sequential(nn.Linear(d_in, d_h), nn.ReLU(), nn.Linear(d_h, d_out))
        params = up(4 * d_in * d_h) + up(4 * d_h) + up(4 * d_h * d_out) + up(4 * d_out)
        assert s.memory.current == params
        x = torch.randn(b, d_in)
        y = mlp(x)
        m = bd(s)
    # saved for backward: x (first addmm), relu's output (relu, second addmm); the weights are
    # saved too but stay parameters; the first Linear's output is freed once relu has run
    assert m["activations"] == up(4 * b * d_in) + up(4 * b * d_h)
    assert m["temporaries"] == up(4 * b * d_out)  # y, saved by nothing
    assert s.memory.current == params + m["activations"] + m["temporaries"]
    # the peak: while relu ran, the first Linear's output and relu's output were both alive (y came later)
    assert s.memory.peak == params + up(4 * b * d_in) + 2 * up(4 * b * d_h)
    del y
    assert bd(s)["activations"] == up(4 * b * d_in)  # x is still referenced here
    assert bd(s)["temporaries"] == 0


def test_checkpointed_blocks_keep_only_their_inputs_as_activations():
    """Non-reentrant activation checkpointing: each block saves nothing but its input (kept for the
    recomputation); the last block's output is a temporary. The backward frees the inputs."""
    from torch.utils.checkpoint import checkpoint

    s = new_session()
    n, d, d_h, blocks = 64, 256, 1024, 4
    with ChargeMode(s):
        layers = nn.ModuleList(nn.Sequential(nn.Linear(d, d_h), nn.GELU(), nn.Linear(d_h, d)) for _ in range(blocks))
        x = torch.randn(n, d)
        h = x
        for layer in layers:
            h = checkpoint(layer, h, use_reentrant=False)
        m = bd(s)
        assert m["activations"] == blocks * up(4 * n * d)  # x and the inputs of blocks 1..3
        assert m["temporaries"] == up(4 * n * d)  # the output
        h.sum().backward()
        del h
        assert bd(s)["activations"] == up(4 * n * d)  # only x, still referenced here


def test_free_lowers_current_bytes():
    s = new_session()
    with ChargeMode(s):
        base = s.memory.current
        a = torch.empty(1000)  # 4000 B -> 4096
        assert s.memory.current == base + 4096
        b = a + 1
        assert s.memory.current == base + 2 * 4096
        del a
        assert s.memory.current == base + 4096
        del b
        assert s.memory.current == base
    assert s.memory.peak == base + 2 * 4096


def test_views_and_parameter_wrapping_are_counted_once():
    s = new_session()
    with ChargeMode(s):
        t = torch.zeros(256, 256)
        size = 4 * 256 * 256
        views = [t.view(-1), t.t(), t[3:7], t.detach(), t.reshape(64, 1024)]
        assert s.memory.current == size
        p = nn.Parameter(t)
        mod = nn.Module()
        mod.w = p
        assert s.memory.current == size
        assert bd(s)["parameters"] == size
        del t, views, p
        assert s.memory.current == size  # the module still holds it
        del mod
        assert s.memory.current == 0


def train_steps(device: str, steps: int = 2) -> dict:
    s = new_session()
    with ChargeMode(s):
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(96, 200, device=device), nn.GELU(), nn.Linear(200, 10, device=device))
        opt = torch.optim.AdamW(mlp.parameters())
        for _ in range(steps):
            x = torch.randn(7, 96, device=device)
            loss = mlp(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            del x, loss
            s.step()
        del mlp, opt
    return s.results()["memory"]


def test_meta_model_gives_the_same_numbers_as_the_real_one():
    real, meta = train_steps("cpu"), train_steps("meta")
    assert real["peak_bytes"] > 0
    assert real == meta
    assert real["current_bytes"] == 0
    assert len(real["step_peak_bytes"]) == 2
    # step 2 starts with the optimizer state alive; its peak is at least step 1's
    assert real["step_peak_bytes"][1] >= real["step_peak_bytes"][0]
    assert real["peak_bytes"] == max(real["step_peak_bytes"])


def test_oom_raises_with_the_breakdown(monkeypatch):
    s = new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="1MiB")
    assert s.memory.limit == MIB
    with ChargeMode(s):
        lin = nn.Linear(256, 256, bias=False)  # 256 KiB of parameters
        before = s.memory.current
        with pytest.raises(torch.cuda.OutOfMemoryError) as err:
            torch.empty(MIB // 4)  # 1 MiB more
        assert s.memory.current == before  # the failed allocation is not counted
        x = torch.empty(100)  # the run goes on below the limit
    msg = str(err.value)
    assert isinstance(err.value, torch.OutOfMemoryError)
    # torch's CUDA allocator's opening, which frameworks match to retry with a smaller batch
    assert msg.startswith("CUDA out of memory. Tried to allocate 1.00 MiB (simulated H100")
    assert "256.00 KiB allocated" in msg
    assert "parameters 256.00 KiB" in msg
    for word in ("gradients", "optimizer", "activations", "temporaries", "peak", "PHANTORA_MEMORY_LIMIT"):
        assert word in msg
    del lin, x
    memory_utils = pytest.importorskip("accelerate.utils.memory")  # the frameworks extra
    assert memory_utils.should_reduce_batch_size(err.value)  # find_executable_batch_size retries a smaller batch


def test_limit_settings(monkeypatch):
    h100 = 81559 * MIB  # the driver-reported total of an H100 SXM 80GB
    s = new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="gpu")
    assert s.memory.capacity == h100
    assert s.memory.limit == h100 - 2 * (1 << 30)
    monkeypatch.setenv("PHANTORA_MEMORY_RESERVE", "1GiB")
    assert new_session().memory.limit == h100 - (1 << 30)
    assert new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="off").memory.limit is None
    assert new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="80e9").memory.limit == 80 * 10**9
    assert new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="75GiB").memory.limit == 75 << 30
    assert parse_size_bytes("4096") == 4096 and parse_size_bytes("1.5 KiB") == 1536
    with pytest.raises(InputError):
        new_session(monkeypatch, PHANTORA_MEMORY_LIMIT="lots")
    caps = {g: MemoryTracker.from_env(get_gpu(g), env={}).capacity >> 20 for g in ("a100", "h200", "b200", "l40s")}
    assert caps == {"a100": 81920, "h200": 143771, "b200": 183359, "l40s": 46068}


def test_tracking_off(monkeypatch):
    s = new_session(monkeypatch, PHANTORA_MEMORY="off")
    with ChargeMode(s):
        assert active() is None
        a = torch.ones(1000)
    assert s.memory.current == 0 and s.memory.peak == 0
    assert s.results()["memory"]["tracked"] is False
    del a


def test_hooks_are_active_only_inside_the_mode():
    s = new_session()
    with ChargeMode(s):
        assert active() is s.memory
    assert active() is None
    lin = nn.Linear(8, 8)  # outside the mode: not seen
    assert s.memory.current == 0
    del lin


def test_fsdp2_storage_frees_and_refills_are_seen_when_they_happen():
    """FSDP2 frees its unsharded parameters with storage.resize_(0) (no aten op): the tracker's wrap
    of its helpers sees each one at once."""
    s = new_session()
    with ChargeMode(s):
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

        t = torch.empty(1024, 1024)
        full = s.memory.current
        _fsdp_param.free_storage(t)
        assert s.memory.current == full - 4 * MIB
        _fsdp_param_group.alloc_storage(t)  # the name the param group calls
        assert s.memory.current == full


def test_in_place_resize_is_noticed():
    s = new_session()
    with ChargeMode(s):
        t = torch.empty(1024)
        assert s.memory.current == 4096
        t.resize_(4096)
        assert s.memory.current == 4 * 4096
        del t
        assert s.memory.current == 0


def test_step_results_summary_and_accessors():
    s = new_session()
    assert pr.memory_allocated() == 0 and pr.max_memory_allocated() == 0  # outside a run
    _session.install(s)
    try:
        with ChargeMode(s):
            a = torch.empty(1 << 20)  # 4 MiB
            b = torch.empty(1 << 18)  # 1 MiB
            del b
            s.step()
            assert pr.memory_allocated() == 4 * MIB
            assert pr.max_memory_allocated() == 5 * MIB
            c = torch.empty(1 << 19)  # 2 MiB
            del c
            s.step()
            del a
    finally:
        _session.install(None)
    mem = s.results()["memory"]
    assert mem["step_peak_bytes"] == [5 * MIB, 6 * MIB]
    assert mem["peak_bytes"] == 6 * MIB
    assert mem["peak_breakdown"]["temporaries"] == 6 * MIB
    assert mem["current_bytes"] == 0
    other = {**s.results(), "rank": 1, "memory": {**mem, "peak_bytes": 7 * MIB}}
    summary = summarize({0: s.results(), 1: other}, get_gpu("h100"))
    assert summary["memory"]["peak_bytes"] == 7 * MIB
    assert summary["memory"]["worst_rank"] == 1
    assert summary["memory"]["per_rank_peak_bytes"] == [6 * MIB, 7 * MIB]
    assert "device memory peak (simulated): 0.01 GiB" in format_summary(summary)


def test_saved_tensor_hook_keeps_autograd_exact():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4), nn.Sigmoid())
    x = torch.randn(5, 16)
    ref = torch.autograd.grad(mlp(x).sum(), list(mlp.parameters()))
    s = new_session()
    with ChargeMode(s):
        got = torch.autograd.grad(mlp(x).sum(), list(mlp.parameters()))
        a = torch.randn(4, requires_grad=True)
        b = a.exp()  # exp saves its output
        b.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()
    assert all(torch.equal(r, g) for r, g in zip(ref, got, strict=True))
    del mlp, x, a, b


def adamw_step(s: RankSession) -> None:
    with ChargeMode(s):
        lin = nn.Linear(256, 256, bias=False)  # 256 KiB
        opt = torch.optim.AdamW(lin.parameters())
        lin(torch.randn(4, 256)).sum().backward()
        opt.step()


def test_oom_inside_the_optimizer_step_names_its_state(monkeypatch):
    free = new_session()
    adamw_step(free)
    peak = free.memory.peak_by_cat
    assert free.memory.breakdown(peak)["optimizer"] == 2 * 256 * 1024 + 512  # the peak is in the step
    s = new_session(monkeypatch, PHANTORA_MEMORY_LIMIT=str(free.memory.peak - 512))
    with pytest.raises(torch.OutOfMemoryError) as err:
        adamw_step(s)
    assert "optimizer 512.50 KiB" in str(err.value)  # exp_avg, exp_avg_sq and step, created in step()


def test_deferred_init_counts_only_what_sharding_makes():
    """A model built and sharded inside (meta init + to_empty in real jobs) costs its shard, not the full model."""
    s = new_session()
    _session.install(s)
    try:
        with ChargeMode(s):
            with pr.deferred_init():
                model = nn.Linear(1024, 1024, bias=False)
                assert s.memory.current == 0
                model.weight = nn.Parameter(model.weight.detach()[:256].clone())  # what a 4-way shard keeps
            assert bd(s)["parameters"] == s.memory.current == 4 * 256 * 1024
            with pr.deferred_init():
                kept = nn.Linear(1024, 1024, bias=False)  # never sharded: all of it is device memory
            assert bd(s)["parameters"] == 4 * 256 * 1024 + 4 * 1024 * 1024
            del kept
    finally:
        _session.install(None)


# ----- the real-mode gloo group keeps no hold on the caller's memory ----------------------------------
def test_gloo_work_does_not_keep_the_callers_storage_alive() -> None:
    """A completed gloo work may be released late, on gloo's own thread; the caller's storage must not wait for it.

    Were gloo handed the caller's tensors, this work object (standing in for the worker thread's
    late reference) would keep the storage alive after the caller dropped it, and the simulated free
    would land at a wall-clock-dependent point of the op stream."""
    import weakref

    from torch._C._distributed_c10d import AllreduceOptions, HashStore, ProcessGroupGloo

    from phantora.runtime.unowned_gloo import UnownedGloo, unowned_alias

    opts = ProcessGroupGloo._Options()
    opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    gloo = UnownedGloo(ProcessGroupGloo(HashStore(), 0, 1, opts))
    t = torch.arange(12, dtype=torch.float32).view(3, 4)[:, 1:]  # a strided view: sizes, strides, offset kept
    held = weakref.ref(t.untyped_storage())
    work = gloo.allreduce([t], AllreduceOptions())
    assert work.wait()
    assert torch.equal(t, torch.arange(12, dtype=torch.float32).view(3, 4)[:, 1:])  # 1 rank: SUM is the identity
    inner = work._work  # gloo's own work object, still alive
    del t, work
    assert held() is None and inner is not None
    a = torch.zeros(6, dtype=torch.bfloat16)
    alias = unowned_alias(a)
    alias.fill_(2)
    assert a.tolist() == [2.0] * 6 and alias.untyped_storage()._cdata != a.untyped_storage()._cdata
