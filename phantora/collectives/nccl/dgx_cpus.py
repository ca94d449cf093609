"""The CPUs of NVIDIA's DGX hosts by GPU, as NCCL's topology detection classes them (`pci_paths.CPU_MODELS`).

From NVIDIA's data sheets: the DGX A100 datasheet (2x AMD EPYC 7742, Rome / Zen 2), the DGX H100 and DGX H200
datasheets (2x Intel Xeon Platinum 8480C, Sapphire Rapids: CPUID family 6 model 0x8F), the DGX B200 datasheet and
user guide (2x Intel Xeon Platinum 8570, Emerald Rapids: family 6 model 0xCF). NCCL's inter-CPU figure of each
(topo.cc `ncclTopoGetInterCpuBw`, v2.30.7-1): AMD_BW 16 GB/s, SRP_QPI_BW 22, ERP_QPI_BW 40.
"""

from __future__ import annotations

from phantora.collectives.nccl.pci_paths import CPU_MODELS, DEFAULT_CPU_MODEL, cpu_model_name

DGX_CPU_MODEL = {  # phantora.perfmodel.gpus name -> the CPU model of the DGX built on it
    "a100": "zen",
    "a100-40gb": "zen",
    "h100": "spr",
    "h100-96gb": "spr",
    "h200": "spr",
    "b200": "emr",
}


def dgx_cpu_model(gpu: str, given: object, vendor: str | None, field: str = "cpu_model") -> str:
    """The CPU model of a DGX-like host of `gpu`s: the one `given` (checked against the hosts' `vendor`, if named),
    else the DGX's of that GPU, else (another GPU, or a DGX CPU not of the named vendor) the vendor's default."""
    if given is not None:
        return cpu_model_name(given, vendor, field=field)
    model = DGX_CPU_MODEL.get(gpu)
    if model is not None and (vendor is None or CPU_MODELS[model][0] == vendor):
        return model
    return DEFAULT_CPU_MODEL[vendor or "intel"]
