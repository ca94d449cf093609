"""The NVLink switch chips' additions as a bound on a one-node NVLS all-reduce (nvls_switch.py), in closed form:
an element of n inputs costs n - 1 additions, spread over the chips a GPU's NVLinks reach (HGX H100/H200: 4,
HGX B200: 2, a GB200 NVL72 rack: 18); a chip adds what the 8-GPU baseboard's NVLS rate (NCCL's nvlsEfficiency)
needs of it, so the bound binds only on NVLink domains of more than 8 GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.nvls_kernel import nvls_kernel_algbw
from phantora.collectives.nccl.nvls_switch import switch_bound_algbw, switch_chips
from phantora.collectives.nccl.platform import Platform
from phantora.topology import dgx_host

B200_NVLINK = 18 * 40.1  # NCCL's rating of a B200's NVLinks (topo.h SM100_NVLINK_BW x 18)
H100_NVLINK = 18 * 20.6  # SM90_NVLINK_BW x 18


def host(gpu: str, gpus: int = 8) -> Platform:
    return platform_of(dgx_host(gpus_per_host=8, gpu=gpu), tuple(range(gpus)))


def domain(gpus: int) -> Platform:
    """One NVLink domain of `gpus` B200s that NCCL's MNNVL sees as one node (a GB200 rack)."""
    return dataclasses.replace(host("b200"), nranks=gpus, ppn=gpus)


def test_switch_chips_a_gpu_reaches():
    assert switch_chips(host("h100")) == 4 and switch_chips(host("b200")) == 2
    assert switch_chips(host("b200", 4)) == 2
    assert switch_chips(domain(72)) == switch_chips(domain(36)) == 18


def test_the_nvl72_rate_is_the_8_gpu_rate_scaled_by_additions_a_chip():
    """8-GPU HGX B200: 721.8 x 0.74 x 8/9 = 474.8 GB/s, 7 additions an element over 2 chips; NVL72: 71 over 18,
    so 474.8 x (7 / 2) / (71 / 18) = 421.3 GB/s, under the 32 heads' NVLink bound 721.8 x 0.74 x 32/33 = 517.9."""
    baseboard = B200_NVLINK * 0.74 * 8 / 9
    expect = baseboard * (7 / 2) / (71 / 18)
    assert switch_bound_algbw(domain(72)) == pytest.approx(expect, rel=1e-12)
    assert expect == pytest.approx(421.3, abs=0.05)
    assert nvls_kernel_algbw("all_reduce", domain(72)) == pytest.approx(expect, rel=1e-12)
    assert B200_NVLINK * 0.74 * 32 / 33 > expect


def test_a_36_gpu_domain_stays_bound_by_its_links():
    """NVL36: 35 additions over 18 chips, 1.94 a chip against the baseboard's 3.5: the 32 heads' links bind."""
    assert switch_bound_algbw(domain(36)) == pytest.approx(B200_NVLINK * 0.74 * 8 / 9 * 3.5 * 18 / 35, rel=1e-12)
    assert nvls_kernel_algbw("all_reduce", domain(36)) == pytest.approx(B200_NVLINK * 0.74 * 32 / 33, rel=1e-12)


@pytest.mark.parametrize("gpu,nvlink,eff", [("h100", H100_NVLINK, 0.85), ("b200", B200_NVLINK, 0.74)])
@pytest.mark.parametrize("gpus", [2, 3, 4, 6, 8])
def test_no_baseboard_group_is_switch_bound(gpu: str, nvlink: float, eff: float, gpus: int):
    """On up to 8 GPUs of a baseboard the chips add at most what the 8-GPU rate needs: the NVLinks bind,
    NVLink x nvlsEfficiency x n / (n + 1) as before."""
    p = host(gpu, gpus)
    assert switch_bound_algbw(p) >= nvls_kernel_algbw("all_reduce", p) - 1e-9
    assert nvls_kernel_algbw("all_reduce", p) == pytest.approx(nvlink * eff * gpus / (gpus + 1), rel=1e-12)
