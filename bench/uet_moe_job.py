"""The MoE job of the live UET study (bench/bench_uet_live.py): examples/mixtral_moe.py with one more model size,
`--model uet-study`, whose traffic is mostly the expert all-to-alls (the replicated attention's all-reduce is small).

    phantora run -t T --nproc 8 --phantom bench/uet_moe_job.py --model uet-study --seq 512 --batch 4 --steps 2
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import mixtral_moe

# one Mixtral-style layer at a quarter of Mixtral's width: 8 experts (one per rank on 8 ranks), top-2
mixtral_moe.CONFIGS["uet-study"] = mixtral_moe.MoEConfig(dim=1024, layers=1, heads=8, kv_heads=2, ffn=3584, experts=8)

if __name__ == "__main__":
    mixtral_moe.main()
