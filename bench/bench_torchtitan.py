"""torchtitan's llama3_8b, unmodified, in phantom mode on simulated H100s (and A100s): cost and figures.

    .venv/bin/python bench/bench_torchtitan.py                      # 8 H100 (testbed16), the published 500 W part
    .venv/bin/python bench/bench_torchtitan.py --gpu h100-sxm       # the same on 700 W H100 SXMs
    .venv/bin/python bench/bench_torchtitan.py --gpus 8 128 1024    # and rail128, leafspine1024
    .venv/bin/python bench/bench_torchtitan.py --gpus 64 --gpu a100 # 64 A100 (rail128)

For each size: wall time, live processes, the ranks' summed peak RSS, and torchtitan's own steady-step
log line (tokens/s/GPU, MFU, memory) beside its published figures (8x H100 Llama 3.1 8B: 5,762
tokens/s/GPU, torchtitan docs/performance.md Table 1 "FSDP", eager; 64x A100 Llama 3 8B: 2,904). The run uses
torchtitan's config with the flags torch 2.13 needs (docs/runtime.md), a generated tokenizer and corpus, and 3 steps.

Each size runs twice (`--torch`): as the published run's torch ran it on its GPUs (PHANTORA_TORCH_VERSION, below)
and as the installed torch runs it. They differ where the releases' CUDA kernels do: from torch 2.9 RMSNorm is one
fused kernel each way, before it the composite's ops (phantora/runtime/simcuda/torch_release.py). The published
runs predate 2.9: Table 1 is the torchtitan paper's (arXiv 2410.06511, October 2024), taken as torch 2.5 (released
2024-10-17); the A100 table is torchtitan's first (spring 2024), taken as torch 2.3. Only whether each is before 2.9
matters to the model.

The local batch is the published runs' (2 on the H100s, 1 on the A100s). torchtitan's memory figure is
the caching allocator's peak *reserved* memory, on a real GPU and here (phantora's allocator model);
"alloc GiB" is the peak bytes tensors held ("steps GiB": in the steady steps, after step 0); "vs pub" the tokens/s
against the published figure. `--alloc-conf` sets PYTORCH_CUDA_ALLOC_CONF for the ranks
(torchtitan's own launcher sets "expandable_segments:True").
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))

from assets import make_torchtitan_assets  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.launcher import RunConfig, launch  # noqa: E402

TOPOLOGY = {8: "testbed16", 64: "rail128", 128: "rail128", 1024: "leafspine1024"}
PUBLISHED = {"h100": 5762, "a100": 2904}  # tokens/s/GPU, torchtitan's docs (8x H100, 64x A100)
PUBLISHED_TORCH = {"h100": "2.5", "a100": "2.3"}  # the torch those runs took (the docstring says why)
BATCH = {"h100": 2, "a100": 1}  # the local batch of those published runs (docs/validation.md)
# The GPU of those published runs: torchtitan's H100s are the Grand Teton hosts' 500 W parts with 96 GB HBM2e
# (docs/gpus.md); `--gpu h100-sxm` runs the 700 W SXM part instead.
VARIANT = {"h100": "h100-96gb", "a100": "a100", "h100-sxm": "h100"}
LINE = re.compile(r"step:\s+(\d+).*?memory:\s+([0-9.]+)GiB.*?tps:\s+([0-9,]+).*?mfu:\s+([0-9.]+)%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8], choices=sorted(TOPOLOGY))
    parser.add_argument("--gpu", default="h100", choices=sorted(VARIANT))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF for the ranks")
    parser.add_argument(
        "--torch", nargs="+", default=["published", "installed"], choices=["published", "installed"],
        help="the torch each run stands for: the published run's, or the installed one",
    )  # fmt: skip
    args = parser.parse_args()
    import torch
    import torchtitan

    train = str(Path(torchtitan.__file__).parent / "train.py")
    work = make_torchtitan_assets(Path(tempfile.mkdtemp(prefix="phantora-titan-")))
    os.chdir(work)
    flags = [
        "--module", "llama3", "--config", "llama3_8b", "--training.steps", str(args.steps),
        "--hf_assets_path", "./tests/assets/tokenizer", "--dataloader.dataset", "c4_test",
        "--parallelism.spmd_backend", "partial_dtensor", "--training.disable_cuda_graphs",
        "--metrics.no-enable-tensorboard", "--debug.seed", "0",
        "--training.local_batch_size", str(BATCH[args.gpu.removesuffix("-sxm")]),
    ]  # fmt: skip
    published = PUBLISHED[args.gpu.removesuffix("-sxm")]
    stacks = {"published": PUBLISHED_TORCH[args.gpu.removesuffix("-sxm")], "installed": torch.__version__}
    print(f"torchtitan llama3_8b, phantom, flow network, {VARIANT[args.gpu]}; published {published} tokens/s/GPU")
    head: tuple[str, ...] = (
        "GPUs",
        "topology",
        "live",
        "wall s",
        "RSS MiB",
        "tok/s/GPU",
        "vs pub",
        "MFU %",
        "mem GiB",
        "alloc GiB",
    )
    head += ("steps GiB", "torch")
    print("{:>5} {:>14} {:>5} {:>7} {:>8} {:>10} {:>7} {:>6} {:>8} {:>9} {:>9} {:>7}".format(*head))
    for n, stack in ((n, stack) for n in args.gpus for stack in args.torch):
        version = stacks[stack]
        env = {"PHANTORA_TORCH_VERSION": version}
        env |= {"PYTORCH_CUDA_ALLOC_CONF": args.alloc_conf} if args.alloc_conf else {}
        gpu = VARIANT[args.gpu]
        cfg = RunConfig(train, flags, TOPOLOGY[n], nproc=n, gpu=gpu, tensors="phantom", timeout_s=3600, env=env)
        t0 = time.perf_counter()
        rep = launch(cfg)
        wall = time.perf_counter() - t0
        plain = re.sub(r"\x1b\[[0-9;]*m", "", rep.logs["rank 0"])
        last = LINE.findall(plain)[-1]
        s = rep.summary
        tps = int(last[2].replace(",", ""))
        steps_peak = max(s["memory"]["step_peak_bytes"][1:] or [0])  # the steady steps' peak (step 0 aside)
        print(
            f"{n:>5} {TOPOLOGY[n]:>14} {s['live_processes']:>5} {wall:>7.1f} {s.get('peak_rss_mb_total', 0):>8.0f} "
            f"{tps:>10} {(tps / published - 1) * 100:>+6.1f}% {float(last[3]):>6.2f} {float(last[1]):>8.2f} "
            f"{s['memory']['peak_bytes'] / 2**30:>9.2f} {steps_peak / 2**30:>9.2f} {version.split('+')[0]:>7}"
        )


if __name__ == "__main__":
    main()
