"""What a program's build-time checks find of the CUDA toolkit (written to argv[1]), then a CUDA extension build."""

import json
import subprocess
import sys

import torch
from torch.utils import cpp_extension

nvcc = cpp_extension.CUDA_HOME + "/bin/nvcc"  # Megatron-LM's fused-kernel loader
banner = subprocess.check_output([nvcc, "-V"], universal_newlines=True).split()
compiled = subprocess.run([nvcc, "-c", "kernel.cu"], capture_output=True, text=True)
seen = {
    "cuda_home": cpp_extension.CUDA_HOME,
    "torch_cuda": torch.version.cuda,
    "release": banner[banner.index("release") + 1],
    "on_path": subprocess.run(["nvcc", "--version"], capture_output=True).returncode,
    "compile": [compiled.returncode, compiled.stderr.strip()],
}
json.dump(seen, open(sys.argv[1], "w"))
cpp_extension.load(name="fused_softmax", sources=["fused_softmax.cpp", "fused_softmax_cuda.cu"])
