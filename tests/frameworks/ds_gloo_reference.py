"""Run a DeepSpeed script as tests/frameworks/test_deepspeed.py's gloo reference, without DeepSpeed's shared-memory
all-reduce op: `torchrun ... ds_gloo_reference.py SCRIPT ARGS...`.

On DeepSpeed's CPU accelerator (`DS_ACCELERATOR=cpu`), `deepspeed.init_distributed()` JIT-builds that op
(deepspeed_shm_comm, two g++ files: 84.8 CPU s and 176.6 s wall at load 18-20 the first time, on every fresh
machine) for `inference_all_reduce` alone, the all-reduce of DeepSpeed-Inference's tensor-parallel layers, which ZeRO
training never calls: its collectives go through torch.distributed, here gloo, whether the op is built or not. Its
torch backend builds the op only if `deepspeed.ops.__compatible_ops__` (computed on first use) says it can; said not,
as on a machine without a compiler, it starts gloo alone, and the script trains exactly as before.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import deepspeed.ops

deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}  # only comm/torch.py's build_shm_op reads it
sys.argv = sys.argv[1:]
sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as `python SCRIPT` would have it
runpy.run_path(sys.argv[0], run_name="__main__")
