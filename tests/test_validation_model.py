"""The Megatron-style GPT of examples/megatron_gpt.py, used for the end-to-end validation against
Narayanan et al. (SC 2021), Table 1: parameter counts against the paper's model names, and the FLOPs
phantora counts for one training iteration against Megatron's formula."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from phantora.runtime.compute import op_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import megatron_gpt as mg

BATCH = 2


class FlopMeter(TorchDispatchMode):
    """Sums the FLOPs phantora's compute model counts for each dispatched op."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.attention_fwd = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flops = op_flops(func, args, kwargs, out)
        self.flops += flops
        if "scaled_dot_product" in str(func) and "backward" not in str(func):
            self.attention_fwd += flops
        return out


@pytest.mark.parametrize(("name", "billions"), [("gpt3-1.7b", 1.7), ("gpt3-3.6b", 3.6), ("gpt3-7.5b", 7.5)])
def test_param_count_matches_the_paper_names(name: str, billions: float) -> None:
    cfg = mg.get_config(name)
    assert mg.param_count(cfg) == pytest.approx(billions * 1e9, rel=0.03)
    # the formula is the model's exact count (2 blocks of the real shapes, built on meta)
    small = mg.get_config(name, layers=2)
    with torch.device("meta"):
        model = mg.GPT(small)
    assert sum(p.numel() for p in model.parameters()) == mg.param_count(small)
    assert mg.param_count(mg.get_config("gpt3-18.4b")) == pytest.approx(18.4e9, rel=0.03)


def test_tiny_param_count_is_exact_with_tied_head() -> None:
    cfg = mg.get_config("tiny")
    model = mg.GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == mg.param_count(cfg)
    assert not any("head" in n or "lm" in n for n, _ in model.named_parameters())  # the head is wte


def counted_flops(cfg: mg.GPTConfig, recompute: str) -> FlopMeter:
    torch.manual_seed(0)
    model = mg.GPT(cfg)
    mg.set_recompute(model, recompute)
    data = torch.randint(0, cfg.vocab, (BATCH, cfg.seq + 1))
    with FlopMeter() as m:
        model(data[:, :-1], data[:, 1:]).backward()
    return m


def test_counted_flops_agree_with_megatron_formula() -> None:
    """One iteration with full recomputation and dropout (the validation runs' settings): phantora's
    counted FLOPs are Megatron's 96 B s l h^2 (1 + s/6h + V/16lh) plus one known difference: the
    flash-attention backward recomputes the scores (2.5 forwards where the formula has 2)."""
    cfg = mg.get_config("tiny")
    formula = mg.megatron_flops(cfg, BATCH)
    m = counted_flops(cfg, "full")
    attention_fwd = 4.0 * BATCH * cfg.seq**2 * cfg.hidden * cfg.layers  # QK^T and AV, full s x s
    assert m.attention_fwd == pytest.approx(2 * attention_fwd, rel=1e-9)  # forward + recompute
    assert m.flops == pytest.approx(formula + 0.5 * attention_fwd, rel=1e-9)
    assert m.flops == pytest.approx(formula, rel=0.02)


def test_unfused_attention_counts_exactly_megatrons_formula() -> None:
    """Megatron-2021 attention (explicit scores, baddbmm + bmm): the backward is 2 forwards, as in the formula."""
    cfg = dataclasses.replace(mg.get_config("tiny"), attention="unfused")
    assert counted_flops(cfg, "full").flops == pytest.approx(mg.megatron_flops(cfg, BATCH), rel=1e-9)


def test_without_recompute_a_quarter_of_the_block_flops_are_gone() -> None:
    """Without recomputation the blocks cost 3 forwards instead of 4 (Megatron's 96 becomes 72)."""
    cfg = mg.get_config("tiny")
    m = counted_flops(cfg, "none")
    s, h, layers, v = cfg.seq, cfg.hidden, cfg.layers, cfg.vocab
    blocks = 72.0 * BATCH * s * layers * h * h * (1 + s / (6 * h))
    logits = 6.0 * BATCH * s * h * v
    attention_fwd = 4.0 * BATCH * s * s * h * layers
    assert m.flops == pytest.approx(blocks + logits + 0.5 * attention_fwd, rel=1e-9)
