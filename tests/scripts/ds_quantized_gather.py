"""ZeRO++'s quantized weight gather (DeepSpeed's `CUDAQuantizer` in partition_parameters.py), written out: each rank
quantizes its fp16 shard with DeepSpeed's `quantizer` extension (built by `torch.utils.cpp_extension.load`, as its
op builder does), all-gathers the int8 values and the scales asynchronously on a side stream behind a 64 MiB
all-reduce (so the gathers start late, as behind ZeRO-3's earlier ones), waits on that stream, and dequantizes the
gathered buffer there. Rank k's shard is (k + 1) x 4,096 points evenly spaced over [-1, 1], one
group: scale 2^8 / (2 (k + 1)), so its values come back as round(128 x) (k + 1) / 128, 127 at x = 1. Rank 0 writes
to argv[1] the largest difference from that closed form over every rank's part.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load

N = 4096
rank = int(os.environ["RANK"])
dist.init_process_group("nccl")
world = dist.get_world_size()
torch.cuda.set_device(rank)
quantizer = load(name="quantizer", sources=["quantization/pt_binding.cpp", "quantization/quantize.cu"])
points = torch.linspace(-1, 1, N, dtype=torch.float64)
shard = ((rank + 1) * points).to(torch.float16).cuda()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    dist.all_reduce(torch.ones(1 << 24, device="cuda"))  # a collective the stream's next ones follow (64 MiB)
    values, scales = quantizer.quantize(shard, 1, 8, quantizer.Symmetric)
    gathered = torch.empty(N * world, dtype=torch.int8, device="cuda")
    gathered_scales = torch.empty(scales.numel() * world, dtype=torch.float32, device="cuda")
    work = dist.all_gather_into_tensor(gathered, values, async_op=True)
    scale_work = dist.all_gather_into_tensor(gathered_scales, scales, async_op=True)
    work.wait()
    scale_work.wait()
    back = quantizer.dequantize(gathered, gathered_scales, gathered_scales.numel(), 8, quantizer.Symmetric)
steps = torch.round(points.to(torch.float16).double() * 128).clamp(-128, 127)
expected = torch.cat([steps * (k + 1) / 128 for k in range(world)])
diff = float((back.cpu().double() - expected).abs().max())
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"max_diff": diff, "dtype": str(back.dtype)}, f)
dist.destroy_process_group()
