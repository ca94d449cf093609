"""The model zoo in examples/: Llama-3-style decoders (FSDP2, TP + FSDP2, activation checkpointing)
and a Mixtral-style MoE with expert parallelism, run live (real mode) on tiny configurations."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from phantora.launcher import RunConfig, launch
from phantora.runtime.compute import build_model, op_flops
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import llama_model as lm  # noqa: E402
import mixtral_moe as mm  # noqa: E402

SEQ, BATCH, STEPS = 32, 2, 2


def star(n: int):
    return leaf_spine(1, n, 0, nic_rate="100Gbps", latency="1us", name=f"star{n}")


def run(script: str, args: list[str], nproc: int):
    return launch(RunConfig(str(EXAMPLES / script), args, star(nproc), nproc=nproc, trace="none", timeout_s=300))


def losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", log)]


def llama_args(*extra: str) -> list[str]:
    return ["--model", "tiny", "--seq", str(SEQ), "--batch", str(BATCH), "--steps", str(STEPS), *extra]


class Meter(TorchDispatchMode):
    """Sums the FLOPs and the H100 time (the default compute model of `phantora run`) of the ops run
    while `on` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.model = build_model(gpu="h100")
        self.on, self.flops, self.ns = True, 0, 0
        self.attention_fwd = 0  # FLOPs of the scaled-dot-product-attention forward

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.on:
            flops = op_flops(func, args, kwargs, out)
            self.flops += flops
            name = str(func)
            if "scaled_dot_product" in name and "backward" not in name:
                self.attention_fwd += flops
            self.ns += self.model.cost(func, args, kwargs, out).ns
        return out


def test_param_count_is_exact_and_matches_published_sizes():
    for name in ("tiny", "small"):
        cfg = lm.get_config(name)
        model = lm.Transformer(cfg, SEQ)
        assert lm.param_count(cfg) == sum(p.numel() for p in model.parameters()), name
    cfg = lm.get_config("tiny", layers=5)
    assert lm.param_count(cfg) == sum(p.numel() for p in lm.Transformer(cfg, SEQ).parameters())
    # published sizes (Meta's Llama 3 model card), from the config alone
    assert lm.param_count(lm.get_config("llama3-8b")) == pytest.approx(8.03e9, rel=0.01)
    assert lm.param_count(lm.get_config("llama3-70b")) == pytest.approx(70.6e9, rel=0.01)
    assert lm.param_count(lm.get_config("llama3-405b")) == pytest.approx(405e9, rel=0.01)
    cfg = lm.get_config("llama3-8b", layers=2)  # the big shapes, built without memory
    with torch.device("meta"):
        model = lm.Transformer(cfg, SEQ)
    assert lm.param_count(cfg) == sum(p.numel() for p in model.parameters())


def check_model_flops(m: Meter, per_token: float, layers: int, dim: int) -> None:
    """6 N per token from the matmuls, 12 L d T from attention. Counted differs in two known ways: the
    RMSNorm weights (2 L + 1 vectors of d, in N) are no matmul, and the flash-attention backward counts
    2.5 forwards (it recomputes the scores) where the formula has 2, the forward being a third of 12 L d T."""
    tokens = BATCH * SEQ
    attention = 12.0 * layers * dim * SEQ * tokens
    norms = (2 * layers + 1) * dim
    assert m.attention_fwd == pytest.approx(attention / 3, rel=1e-9)
    assert m.flops == pytest.approx((per_token - 6 * norms) * tokens + attention / 6, rel=1e-9)


def test_flops_per_token_equals_the_counted_matmul_and_attention_flops():
    """One training step of each tiny model: phantora's counted FLOPs against the MFU formula."""
    cfg = lm.get_config("tiny")
    torch.manual_seed(0)
    model = lm.Transformer(cfg, SEQ)
    tokens = torch.randint(0, cfg.vocab, (BATCH, SEQ + 1))
    with Meter() as m:
        lm.loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    check_model_flops(m, lm.flops_per_token(cfg, SEQ), cfg.layers, cfg.dim)
    cfg = mm.get_config("tiny")
    moe = mm.MoEModel(cfg, SEQ, "uniform")
    x, target = mm.batch(cfg, BATCH, SEQ, 0, 0, 0, torch.float32)
    with Meter() as m:
        mm.loss_fn(moe(x), target).backward()
    check_model_flops(m, mm.flops_per_token(cfg, SEQ), cfg.layers, cfg.dim)


@pytest.fixture(scope="module")
def llama_fsdp_fp32():
    """FSDP2 on 2 ranks in fp32 without activation checkpointing (--ac none, the default), run once: the
    TP comparison and the op-level checkpointing test read the same run."""
    return run("llama_train.py", llama_args("--parallel", "fsdp", "--dtype", "fp32"), 2)


def test_llama_fsdp_and_tp_fsdp_train_alike_and_report_throughput(llama_fsdp_fp32):
    """FSDP2 on 2 ranks and TP2 x FSDP2 on 4 ranks (same 2 data-parallel batches) give the same losses."""
    fsdp = llama_fsdp_fp32
    tp = run("llama_train.py", llama_args("--parallel", "tp-fsdp", "--tp", "2", "--dtype", "fp32"), 4)
    lf, lt = losses(fsdp.logs["rank 0"]), losses(tp.logs["rank 0"])
    assert len(lf) == STEPS and lt == pytest.approx(lf, rel=1e-4)
    assert lf[1] < lf[0]
    cfg = lm.get_config("tiny")
    tokens = BATCH * SEQ * 2  # dp = 2 in both runs
    for rep, world in ((fsdp, 2), (tp, 4)):
        s = rep.summary
        assert s["workload"]["tokens_per_step"] == tokens
        assert s["workload"]["flops_per_step"] == pytest.approx(lm.flops_per_token(cfg, SEQ) * tokens)
        step_s = s["step_time_ns"]["mean"] * 1e-9
        assert s["tokens_per_s_per_gpu"] == pytest.approx(tokens / step_s / world, rel=1e-3)
        assert 0 < s["mfu"] < 1 and s["mfu_dtype"] == "fp32"
        comm = s["ranks"][0]["comm"]
        assert comm["all_gather"]["count"] > 0 and comm["reduce_scatter"]["count"] > 0
    # Megatron pattern: one all-reduce per sub-layer (attention, MLP) forward and one backward
    assert "all_reduce" not in fsdp.summary["ranks"][0]["comm"]
    assert all(rk["comm"]["all_reduce"]["count"] == 4 * cfg.layers * STEPS for rk in tp.summary["ranks"])


def test_llama_bf16_mixed_precision_reports_bf16_mfu():
    rep = run("llama_train.py", llama_args("--parallel", "fsdp", "--dtype", "bf16"), 2)
    s = rep.summary
    assert s["mfu_dtype"] == "bf16" and 0 < s["mfu"] < 1
    assert s["ranks"][0]["flops_by_dtype"].get("bf16", 0) > s["ranks"][0]["flops_by_dtype"].get("fp32", 0)
    assert len(losses(rep.logs["rank 0"])) == STEPS


@pytest.mark.slow  # ~27 s; op-level checkpointing (below) checks recomputation by default
def test_activation_checkpointing_recomputes_the_forward():
    """Full AC adds about the blocks' forward compute to a step; selective (every other block) half."""
    compute, time_ns = {}, {}
    for ac in ("none", "selective", "full"):
        s = run("llama_train.py", llama_args("--parallel", "fsdp", "--dtype", "fp32", "--ac", ac), 2).summary
        compute[ac], time_ns[ac] = s["steps"][1]["compute_ns"], s["steps"][1]["time_ns"]
    # the blocks' forward on one rank, timed by the run's compute model in this process
    cfg = lm.get_config("tiny")
    torch.manual_seed(0)
    model = lm.Transformer(cfg, SEQ)
    meter = Meter()
    meter.on = False
    for block in model.layers:
        block.register_forward_pre_hook(lambda *a: setattr(meter, "on", True))
        block.register_forward_hook(lambda *a: setattr(meter, "on", False))
    with torch.no_grad(), meter:
        model(torch.randint(0, cfg.vocab, (BATCH, SEQ)))
    fwd = meter.ns
    full, half = compute["full"] - compute["none"], compute["selective"] - compute["none"]
    # non-reentrant checkpointing stops recomputing once every saved tensor is back (the block's
    # last projection and residual add are not), so the recompute is a bit under the forward
    assert 0.6 * fwd < full <= 1.02 * fwd, (full, fwd)
    assert half == pytest.approx(full / 2, rel=0.1)
    assert time_ns["full"] > time_ns["selective"] > time_ns["none"]


def test_op_level_checkpointing_trains_the_same_and_recomputes_only_cheap_ops(llama_fsdp_fp32):
    """--ac op (torchtitan's op-level selective AC): the same losses as no AC; it recomputes less than
    full AC (matmuls but every second one, and attention, are kept) and saves fewer activations than none."""
    runs = {"none": llama_fsdp_fp32}  # --ac none is llama_train.py's default
    for ac in ("op", "full"):
        runs[ac] = run("llama_train.py", llama_args("--parallel", "fsdp", "--dtype", "fp32", "--ac", ac), 2)
    assert losses(runs["op"].logs["rank 0"]) == losses(runs["none"].logs["rank 0"])
    compute = {ac: r.summary["steps"][1]["compute_ns"] for ac, r in runs.items()}
    assert compute["none"] < compute["op"] < compute["full"]
    acts = {ac: r.summary["memory"]["breakdown_at_peak"]["activations"] for ac, r in runs.items()}
    assert acts["full"] < acts["op"] < acts["none"]


def moe_reference(routing: str, world: int, lr: float) -> list[float]:
    """Rank 0's losses from one process holding every expert, trained on the mean loss of all ranks."""
    cfg = mm.get_config("tiny")
    torch.manual_seed(0)
    model = mm.MoEModel(cfg, SEQ, routing, 0, 1, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for step in range(STEPS):
        opt.zero_grad()
        per_rank = [
            mm.loss_fn(model(x), t)
            for x, t in (mm.batch(cfg, BATCH, SEQ, 0, step, r, torch.float32) for r in range(world))
        ]
        torch.stack(per_rank).mean().backward()
        opt.step()
        out.append(per_rank[0].item())
    return out


# uniform routing on 2 EP ranks is slow: the default suite runs it on EP sub-groups (strided, below) and top-k
# routing, which adds the count exchange, here
@pytest.mark.parametrize("routing,per_layer", [pytest.param("uniform", 4, marks=pytest.mark.slow), ("topk", 5)])
def test_moe_expert_parallel_all_to_all(routing, per_layer):
    """2 EP ranks, 2 experts each: the forward's dispatch and combine all-to-alls (+ the count exchange for
    top-k) and their backward; losses equal one process holding all 4 experts."""
    lr = 1e-2
    args = ["--model", "tiny", "--seq", str(SEQ), "--batch", str(BATCH), "--steps", str(STEPS)]
    rep = run("mixtral_moe.py", [*args, "--routing", routing, "--dtype", "fp32", "--lr", str(lr)], 2)
    layers = mm.get_config("tiny").layers
    for rk in rep.summary["ranks"]:
        assert rk["comm"]["all_to_all"]["count"] == per_layer * layers * STEPS
        assert rk["comm"]["all_reduce"]["count"] == STEPS  # the replicated parameters' gradients
    assert losses(rep.logs["rank 0"]) == pytest.approx(moe_reference(routing, 2, lr), rel=1e-4)
    assert rep.summary["tokens_per_s_per_gpu"] > 0 and 0 < rep.summary["mfu"] < 1


def test_moe_expert_groups_cover_the_world() -> None:
    """Block and strided EP groups: every rank in exactly one EP group of `ep` ranks, at its index there;
    its expert data-parallel group holds the rank of the same index in every EP group."""
    world, ep = 16, 4
    for layout, first in (("block", [0, 1, 2, 3]), ("strided", [0, 4, 8, 12])):
        places = [mm.expert_groups(r, world, ep, layout) for r in range(world)]
        assert places[0].ep_ranks == first
        for r, g in enumerate(places):
            assert g.ep_ranks[g.ep_rank] == r and len(g.ep_ranks) == ep
            assert len(g.edp_ranks) == world // ep and r in g.edp_ranks
            assert {places[q].ep_rank for q in g.edp_ranks} == {g.ep_rank}
        assert sorted(r for g in {tuple(p.ep_ranks) for p in places} for r in g) == list(range(world))
    with pytest.raises(SystemExit, match="does not divide"):
        mm.expert_groups(0, 16, 3, "block")


# block is slow: the same sub-group all-to-alls and expert all-reduces as strided, over other ranks, which
# test_moe_expert_groups_cover_the_world checks for both layouts
@pytest.mark.parametrize("layout", [pytest.param("block", marks=pytest.mark.slow), "strided"])
def test_moe_expert_parallel_sub_groups(layout: str) -> None:
    """4 ranks, EP 2 (2 experts each, 2 replicas): all-to-alls within each EP group, the experts' gradients
    summed over the 2 replicas; losses equal one process holding all 4 experts."""
    lr = 1e-2
    args = ["--model", "tiny", "--seq", str(SEQ), "--batch", str(BATCH), "--steps", str(STEPS), "--ep", "2"]
    rep = run("mixtral_moe.py", [*args, "--ep-layout", layout, "--dtype", "fp32", "--lr", str(lr)], 4)
    layers = mm.get_config("tiny").layers
    for rk in rep.summary["ranks"]:
        assert rk["comm"]["all_to_all"]["count"] == 4 * layers * STEPS
        assert rk["comm"]["all_reduce"]["count"] == 2 * STEPS  # replicated parameters, then the experts
    assert losses(rep.logs["rank 0"]) == pytest.approx(moe_reference("uniform", 4, lr), rel=1e-4)
