"""One reader of the hosts' CPU text (phantora/collectives/nccl/cpu_vendor.py): the platform (`cpu_vendor`), the
P2P-off PCIe host of an NVLink host (`nvlink_pci`) and the published tables' grouping (`spread.machine_key`) class
the same text as the same vendor, "arm (NVIDIA Grace)" as arm in all three."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from phantora.collectives.nccl.cpu_vendor import vendor_named
from phantora.collectives.nccl.nvlink_pci import host_pci, named_vendor
from phantora.collectives.nccl.pci_paths import CPU_MODELS, DEFAULT_CPU_MODEL
from phantora.collectives.nccl.platform import cpu_vendor
from phantora.collectives.nccl.published import Table
from phantora.collectives.nccl.settings import settings_of
from phantora.collectives.nccl.spread import machine_key
from phantora.errors import InputError
from phantora.topology import dgx_host

TEXTS = [
    ("arm (NVIDIA Grace)", "arm"),  # the GB200 NVL72 table's cpu=
    ("aarch64", "arm"),
    ("ARM64", "arm"),
    ("2x AMD EPYC 7742 (DGX A100 system spec)", "amd"),
    ("Intel Xeon Platinum 8480C", "intel"),
]


@pytest.mark.parametrize(("text", "vendor"), TEXTS)
def test_platform_pci_host_and_table_grouping_read_the_same_vendor(text, vendor):
    topo = dgx_host(gpus_per_host=8, gpu="b200")
    topo.meta["cpu"] = text
    assert vendor_named(text) == vendor
    assert cpu_vendor(topo) == vendor
    assert named_vendor(topo) == vendor
    table = Table(Path("b200_8gpu_1node_all_reduce_x.csv"), "b200", 8, 1, "all_reduce", None, (), cpu=text)
    assert machine_key(table)[-1] == vendor


def test_p2p_off_host_of_a_grace_topology_is_arm_not_intel():
    """NCCL_P2P_DISABLE=1 on 8 B200s whose cpu is "arm (NVIDIA Grace)": the DGX B200's Emerald Rapids is not of that
    vendor, so the PCIe host takes arm's default CPU model (pci_paths.DEFAULT_CPU_MODEL), as the platform does."""
    topo = dgx_host(gpus_per_host=8, gpu="b200")
    topo.meta["cpu"] = "arm (NVIDIA Grace)"
    gpus = [n.id for n in topo.nodes if n.kind == "gpu"]
    host = host_pci(topo, gpus, "b200", 64e9, settings_of((("NCCL_P2P_DISABLE", "1"),)))
    assert host.cpu == CPU_MODELS[DEFAULT_CPU_MODEL["arm"]][0] == "arm" == cpu_vendor(topo)


def test_blank_is_none_and_unnamed_text_is_a_one_line_error_naming_the_table():
    assert vendor_named(None) is None and vendor_named("  ") is None
    table = Table(Path("x.csv"), "h100", 8, 1, "all_reduce", None, ())
    assert machine_key(table)[-1] == "intel"  # no cpu= in the table: NCCL's x86 default
    with pytest.raises(InputError, match=r"^x\.csv: field 'cpu': .*'PowerPC'"):
        machine_key(replace(table, cpu="PowerPC"))
