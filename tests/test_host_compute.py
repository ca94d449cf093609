"""The host compute model (perfmodel/hosts.py, runtime/hostwork.py) against closed forms and a published figure.

A DGX H100 host has 2 sockets x 8 channels of DDR5-4800: 2 x 8 x 4800 MT/s x 8 B = 614.4 GB/s. A rank that shares it
with 7 others gets MEM_EFF / 8 of it, or what its threads' cores draw if that is less; a host op takes its bytes over
that bandwidth (or its FLOPs over the cores' peak, if longer). Its time is the host's: the GPU runs nothing issued after
it before its end, and a GPU busy past it hides it. A copy between host and GPU crosses the GPU's PCIe link: pinned at
PCIE_EFF of it, pageable at half a core's bandwidth at most; a blocking one makes the host wait for it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from phantora.errors import InputError
from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.hosts import (
    COPY_FLOOR_NS,
    FAULT_NS,
    GRAIN,
    HOSTS,
    MEM_EFF,
    MMAP_MAX,
    PAGE_BYTES,
    PCIE_EFF,
    fault_ns,
    get_host,
    host_of_gpu,
    op_ns,
    rank_share,
)
from phantora.runtime import hostwork
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.simcuda import pinned

aten = torch.ops.aten
CUDA0 = torch.device("cuda", 0)
N = 1 << 20  # elements of fp32 host tensors: 4 MiB each, above torch's grain (one thread below it)
H100 = get_gpu("h100")
DGX_H100 = get_host("dgx-h100")


def test_the_hosts_peaks_are_their_data_sheets() -> None:
    assert DGX_H100.mem_bw == 2 * 8 * 4800e6 * 8 == 614.4e9
    assert DGX_H100.cores == 112 and DGX_H100.core_flops == 2.0e9 * 16 * 2 * 2
    assert get_host("dgx-a100").mem_bw == 2 * 8 * 3200e6 * 8 and get_host("DGX A100").cores == 128
    assert get_host("dgx-b200").mem_bw == 2 * 8 * 5600e6 * 8
    assert host_of_gpu("h200") is DGX_H100 and host_of_gpu("a100") is get_host("dgx-a100")
    assert host_of_gpu("l40s") is DGX_H100  # no DGX of its own: the default
    with pytest.raises(InputError, match="unknown host 'dgx-9'.*dgx-h100"):
        get_host("dgx-9")


def test_a_rank_gets_its_threads_cores_and_at_most_its_share_of_the_memory() -> None:
    one = rank_share(DGX_H100, 8, 1)
    assert one.cores == 1 and one.bw == DGX_H100.core_bw  # one core draws less than 1/8 of the sockets
    full = rank_share(DGX_H100, 8, 14)
    assert full.cores == 14 and full.bw == MEM_EFF * 614.4e9 / 8  # 57.6 GB/s: the sockets shared by 8 ranks
    over = rank_share(DGX_H100, 8, 112)  # 8 x 112 threads on 112 cores: 14 cores' worth each
    assert over.cores == 14 and over.flops == 14 * DGX_H100.core_flops
    alone = rank_share(DGX_H100, 1, 112)
    assert alone.bw == MEM_EFF * 614.4e9
    with pytest.raises(InputError):
        rank_share(DGX_H100, 0, 1)


def test_a_host_op_is_the_roofline_of_its_bytes_and_flops() -> None:
    share = rank_share(DGX_H100, 8, 14)
    assert op_ns(share, 12 * N) == math.ceil(12 * N / (MEM_EFF * 614.4e9 / 8) * 1e9)
    flops = 10**12  # compute-bound: 1 TFLOP on 14 cores' FP32 peak
    assert op_ns(share, 8, flops) == math.ceil(flops / (14 * DGX_H100.core_flops) * 1e9)
    small = GRAIN - 1  # torch runs it on one thread
    assert op_ns(share, 12 * small, 0, small) == math.ceil(12 * small / (share.bw / 14) * 1e9)
    assert op_ns(share, 0) == 0


def test_deepspeed_cpu_adam_is_within_the_zero_offload_papers_figures() -> None:
    """ZeRO-Offload (Ren et al., USENIX ATC'21), Table 4: CPU-Adam's step on a DGX-2 (2 x Xeon Platinum 8168,
    DDR4-2666 x 6 a socket) takes 0.22 s for 1B parameters, 1.03 s for 4B, 2.57 s for 10B. The model, all 48 cores
    on one rank, fp32 states: 28 B a parameter over MEM_EFF of 255.9 GB/s, 0.66 / 0.57 / 0.57 of those (the paper's
    kernel reached ~0.5 of the theoretical bandwidth, the model assumes a STREAM-like 0.75)."""
    share = rank_share(get_host("dgx-2"), 1, 48)
    for params, paper_s in ((1e9, 0.22), (4e9, 1.03), (10e9, 2.57)):
        n = int(params)
        t = torch.empty(n, device="meta")
        model_s = op_ns(share, hostwork.adam_bytes(t, t, t, t), hostwork.ADAM_FLOPS * n, n) / 1e9
        assert model_s == pytest.approx(28 * params / (MEM_EFF * 2 * 6 * 2666e6 * 8), rel=1e-6)
        assert 0.5 * paper_s < model_s < paper_s


def _torch_1_6_adam_ns(model: hostwork.HostModel, n: int) -> int:
    """torch 1.6's Adam step (the paper's PyTorch: no weight decay) on one fp32 tensor of `n` parameters, op by op as
    the model times it: exp_avg.mul_(b1).add_(g, alpha=1 - b1); exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2);
    denom = (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(exp_avg, denom, value=-step_size)."""
    p, g, m, v = (torch.empty(n, device="meta") for _ in range(4))
    total = 0

    def op(func: object, *args: object, **kwargs: object) -> torch.Tensor:
        nonlocal total
        out = func(*args, **kwargs)  # type: ignore[operator]
        total += model.op_ns(func, args, kwargs, out)
        return out

    op(aten.mul_.Scalar, m, 0.9)
    op(aten.add_.Tensor, m, g, alpha=0.1)
    op(aten.mul_.Scalar, v, 0.999)
    op(aten.addcmul_.default, v, g, g, value=0.001)
    denom = op(aten.div.Scalar, op(aten.sqrt.default, v), 0.5)
    op(aten.add_.Scalar, denom, 1e-8)
    op(aten.addcdiv_.default, p, m, denom, value=-0.01)
    return total


def test_torch_adam_is_within_the_zero_offload_papers_pytorch_figures() -> None:
    """ZeRO-Offload's Table 4, PyTorch's CPU Adam on the DGX-2: 1.39 / 5.71 / 14.76 s for 1 / 4 / 10 B parameters.
    The model: 21 arrays x 4 B a parameter over MEM_EFF of 255.9 GB/s (the gradient counted twice by addcmul_), plus
    the page faults of the two fresh temporaries (sqrt's and div's outputs, 4 B a parameter each, a fresh mapping
    every step), FAULT_NS a 4 KiB page one at a time: within 10 % of each."""
    model = hostwork.HostModel(get_host("dgx-2"), 1, 16e9, 48)
    bw = MEM_EFF * 2 * 6 * 2666e6 * 8
    for params, paper_s in ((10**9, 1.39), (4 * 10**9, 5.71), (10**10, 14.76)):
        ns = _torch_1_6_adam_ns(model, params)
        closed = 21 * 4 * params / bw * 1e9 + 2 * math.ceil(4 * params / PAGE_BYTES) * FAULT_NS
        assert ns == pytest.approx(closed, abs=16)  # each op rounded up to the ns
        assert ns / 1e9 == pytest.approx(paper_s, rel=0.10)


def test_only_a_large_fresh_output_faults_its_pages() -> None:
    """sqrt of 32 MiB allocates a fresh mapping (glibc's mmap threshold's ceiling): 8192 faults; in place, or below
    the threshold (the heap's warm memory), none."""
    model = hostwork.HostModel(DGX_H100, 1, H100.host_bw, 1)
    big, small = torch.empty(MMAP_MAX // 4, device="meta"), torch.empty(MMAP_MAX // 4 - 1024, device="meta")
    share = rank_share(DGX_H100, 1, 1)

    def ns(func: object, x: torch.Tensor) -> int:
        return model.op_ns(func, (x,), {}, func(x))  # type: ignore[operator]

    assert ns(aten.sqrt.default, big) == op_ns(share, 2 * MMAP_MAX) + MMAP_MAX // PAGE_BYTES * FAULT_NS
    assert ns(aten.sqrt_.default, big) == op_ns(share, 2 * MMAP_MAX)
    assert ns(aten.sqrt.default, small) == op_ns(share, 2 * small.nbytes)
    assert hostwork.fresh_outputs(aten.sqrt_.default, big) == [] and fault_ns(MMAP_MAX - 1) == 0


def test_a_pinned_output_faults_no_pages() -> None:
    """A pinned allocation comes from torch's CachingHostAllocator (page-locked blocks, populated when the driver
    locked them and reused), not a fresh glibc mapping: pinning 32 MiB (`_pin_memory`, `pin_memory=True`) costs the
    copy's or the fill's bytes and no faults, while the same op's pageable output faults its 8192 pages."""
    model = hostwork.HostModel(DGX_H100, 1, H100.host_bw, 1)
    share = rank_share(DGX_H100, 1, 1)
    x = torch.empty(MMAP_MAX // 4, device="meta")
    faults = MMAP_MAX // PAGE_BYTES * FAULT_NS

    def ns(func: object, args: tuple, kwargs: dict) -> int:
        return model.op_ns(func, args, kwargs, pinned.host_op(func, args, kwargs))

    assert ns(aten._pin_memory.default, (x,), {}) == op_ns(share, 2 * MMAP_MAX)
    assert ns(aten.clone.default, (x,), {}) == op_ns(share, 2 * MMAP_MAX) + faults
    shape = ([MMAP_MAX // 4],)
    pageable = ns(aten.zeros.default, shape, {"device": "meta"})
    assert ns(aten.zeros.default, shape, {"device": "meta", "pin_memory": True}) == pageable - faults
    assert pageable == op_ns(share, MMAP_MAX) + faults


def _charge_mode(charge_mode: ChargeMode, threads: int = 1) -> ChargeMode:
    charge_mode.session.host = hostwork.HostModel(DGX_H100, 8, H100.host_bw, threads)
    return charge_mode


def test_a_host_op_holds_the_gpu_back_unless_the_gpu_is_busy_past_it(charge_mode: ChargeMode) -> None:
    mode = _charge_mode(charge_mode)
    s = mode.session
    a, b = torch.ones(N), torch.ones(N)
    add_ns = math.ceil(12 * N / DGX_H100.core_bw * 1e9)  # a += b: reads a and b, writes a, on one core
    with mode:
        aten.full.default([4], 1.0, device=CUDA0)  # the program uses the GPU: CPU tensors are host data now
        s.sync()
        t0 = s.clock.compute_ns
        a.add_(b)
        assert s.host_ns == s.clock.compute_ns == t0 + add_ns and s.host_idle_ns == add_ns
        big = aten.full.default([4096, 4096], 1.0, device=CUDA0)
        aten.mm.default(big, big)  # 137 GFLOP: about 0.14 ms of GPU, past the host's next op
        busy_until, host0 = s.clock.compute_ns, s.host_ns
        assert busy_until - host0 > add_ns
        a.add_(b)  # hidden: the GPU is still busy
        assert s.clock.compute_ns == busy_until and s.host_ns == host0 + add_ns and s.host_idle_ns == add_ns
    assert s.results()["host_work"]["host_ns"] == 2 * add_ns and a[0].item() == 3.0


def test_torch_adam_on_host_parameters_moves_19_arrays_an_element(charge_mode: ChargeMode) -> None:
    """torch.optim.Adam on CPU parameters (torch 2.13's single-tensor path): lerp_ (3 arrays), mul_ (2), addcmul_ (4:
    the gradient read twice), sqrt (2), div (2), add_ (2), addcdiv_ (4); 19 x 4 B a parameter, DeepSpeed's fused
    update 7 x 4 B."""
    mode = _charge_mode(charge_mode, threads=14)
    s = mode.session
    p = torch.nn.Parameter(torch.ones(N))
    p.grad = torch.ones(N)
    opt = torch.optim.Adam([p], lr=0.1)
    with mode:
        aten.full.default([4], 1.0, device=CUDA0)
        opt.step()  # the first step makes the moments
        before = s.host_work_ns
        opt.step()
        ns = s.host_work_ns - before
    per_array = 4 * N / (MEM_EFF * 614.4e9 / 8) * 1e9
    assert ns == pytest.approx(19 * per_array, abs=8)  # each op's time rounded up to the ns


def test_copies_cross_the_pcie_link_pinned_or_pageable(charge_mode: ChargeMode) -> None:
    mode = _charge_mode(charge_mode)
    s = mode.session
    a = torch.ones(N)
    pageable = COPY_FLOOR_NS + math.ceil(4 * N / (DGX_H100.core_bw / 2) * 1e9)
    dma = COPY_FLOOR_NS + math.ceil(4 * N / (PCIE_EFF * H100.host_bw) * 1e9)
    with mode:
        d = aten._to_copy.default(a, device=CUDA0)  # pageable to the GPU: the driver's staging copy, blocking
        assert s.pcie["h2d"] == [1, 4 * N, pageable] and s.host_ns == s.clock.compute_ns
        t0 = s.clock.compute_ns
        back = aten._to_copy.default(d, device=torch.device("cpu"))  # .cpu(): blocking
        assert type(back) is torch.Tensor and s.clock.compute_ns == t0 + pageable and s.host_ns == s.clock.compute_ns
        pinned.mark(a)
        host0, t0 = s.host_ns, s.clock.compute_ns
        aten.copy_.default(d, a.view(2, -1).view(-1), True)  # a view of pinned memory, non_blocking: the host goes on
        assert s.clock.compute_ns == t0 + dma and s.host_ns == host0 and s.pcie["h2d"][0] == 2
        aten.copy_.default(a, d)  # into pinned memory, blocking
        assert s.pcie["d2h"] == [2, 8 * N, pageable + dma] and s.host_ns == s.clock.compute_ns
        host0, t0 = s.host_ns, s.clock.compute_ns
        off = aten._to_copy.default(d, device=torch.device("cpu"), non_blocking=True)  # torch pins its output
        assert s.clock.compute_ns == t0 + dma and s.host_ns == host0 and pinned.is_pinned(off)


def test_a_cast_on_the_gpu_crosses_no_link(charge_mode: ChargeMode) -> None:
    """In real mode a cast of a simulated-GPU tensor runs again on the host tensor holding its data, as
    `_to_copy(..., device="cpu")`: the GPU's own work, no PCIe copy (FSDP2's bf16 casts were charged 8 MiB d2h)."""
    mode = _charge_mode(charge_mode)
    s = mode.session
    with mode:
        d = aten.full.default([N], 1.0, device=CUDA0)
        half = d.to(torch.bfloat16)
        aten._to_copy.default(d, dtype=torch.bfloat16, device=CUDA0)
        assert half.is_cuda and not any(n for n, _, _ in s.pcie.values())
        d.cpu()  # a real copy off the GPU still crosses the link
        assert s.pcie["d2h"][:2] == [1, 4 * N]


def test_views_and_aliases_of_pinned_memory_are_pinned_memory_in_both_modes() -> None:
    for dev in ("cpu", "meta"):  # phantom mode's host tensors are meta: no address, the same storage
        buf, other = torch.empty(64, device=dev), torch.empty(64, device=dev)
        pinned.mark(buf)
        assert pinned.in_pinned_memory(buf.detach()) and pinned.in_pinned_memory(buf.view(8, 8)[2])
        assert not pinned.in_pinned_memory(other)


def test_an_in_place_op_that_returns_nothing_still_writes() -> None:
    xs = [torch.ones(N), torch.ones(N)]
    assert hostwork.written_bytes(aten._foreach_mul_.Scalar, (xs, 2.0), {}, None) == 8 * N
    out = torch.ones(N)
    assert hostwork.written_bytes(aten.add_.Tensor, (out, out), {}, out) == 0  # its output counts it
    p, g, m, v = ([torch.ones(N)] for _ in range(4))
    step = [torch.ones(())]
    fused = aten._fused_adamw_.default
    kw = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "eps": 1e-8, "amsgrad": False}
    kw |= {"maximize": False}
    assert hostwork.written_bytes(fused, (p, g, m, v, [], step), kw, None) == 3 * 4 * N  # not the gradients
    scaled = {**kw, "grad_scale": torch.ones(())}
    assert hostwork.written_bytes(fused, (p, g, m, v, [], step), scaled, None) == 4 * 4 * N  # unscaled in place


def test_the_host_and_threads_come_from_the_environment() -> None:
    m = hostwork.from_env(get_gpu("a100"), {"LOCAL_WORLD_SIZE": "4", "PHANTORA_HOST_THREADS": "16"})
    assert m.host.name == "dgx-a100" and m.ranks == 4 and m.threads() == 16 and m.link_bw == 32e9
    assert hostwork.from_env(H100, {"PHANTORA_HOST": "dgx-b200"}).host is HOSTS["dgx-b200"]
    assert hostwork.from_env(H100, {}).threads() == torch.get_num_threads()
    with pytest.raises(InputError, match="PHANTORA_HOST_THREADS"):
        hostwork.from_env(H100, {"PHANTORA_HOST_THREADS": "zero"})


def test_the_model_is_switched_on_by_its_variable() -> None:
    assert not hostwork.enabled({}) and not hostwork.enabled({"PHANTORA_HOST_COMPUTE": "off"})
    assert hostwork.enabled({"PHANTORA_HOST_COMPUTE": "on"}) and hostwork.enabled({"PHANTORA_HOST_COMPUTE": "1"})
    with pytest.raises(InputError, match="PHANTORA_HOST_COMPUTE"):
        hostwork.enabled({"PHANTORA_HOST_COMPUTE": "yes please"})


def test_a_topology_file_names_its_hosts(tmp_path: Path) -> None:
    from phantora.topology.tomlfile import read_toml

    good = tmp_path / "a100s.toml"
    good.write_text('gpu = "a100"\nhost = "DGX A100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n')
    assert read_toml(good).meta["host"] == "dgx-a100"
    bad = tmp_path / "bad.toml"
    bad.write_text('host = "dgx-9"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n')
    with pytest.raises(InputError, match="unknown host 'dgx-9'") as err:
        read_toml(bad)
    assert err.value.file == str(bad) and err.value.field == "host" and err.value.line == 1
