"""Phantom mode's MoE routing and the ops that keep values (phantora/runtime/simcuda/kept_values.py).

With balanced routing each of E experts gets T k / E of T tokens' k choices (closed form), each token's k choices
are distinct, and an EP all-to-all's split sizes follow: with P ranks of E / P experts each, a rank sends T k / P
tokens to every rank. The fast tests check the helpers on plain tensors; the slow one runs a phantom rank through
the op sequences of torchtitan's and Megatron-Core's routers (tests/scripts/phantom_routing.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phantora.launcher import RunConfig, launch
from phantora.results.summary import format_summary
from phantora.runtime.simcuda import grouped_routing
from phantora.runtime.simcuda import kept_values as kv

SCRIPT = Path(__file__).resolve().parent / "scripts" / "phantom_routing.py"
GROUP_SCRIPT = SCRIPT.with_name("phantom_group_routing.py")


@pytest.mark.parametrize(("tokens", "experts", "k"), [(512, 8, 3), (48, 8, 2), (256, 4, 2), (7, 64, 6)])
def test_balanced_routing_gives_every_expert_its_share(tokens: int, experts: int, k: int) -> None:
    ids = kv.balanced((tokens, experts), k)
    assert ids.shape == (tokens, k) and ids.dtype == torch.int64
    assert all(len(set(row)) == k for row in ids.tolist())  # k distinct experts a token
    counts = torch.bincount(ids.reshape(-1), minlength=experts).tolist()
    share = tokens * k / experts
    assert all(abs(c - share) < 1 for c in counts) and sum(counts) == tokens * k
    if tokens * k % experts == 0:
        assert counts == [tokens * k // experts] * experts


def test_balanced_routing_along_another_dim_and_the_all_to_all_splits() -> None:
    batch, seq, experts, k, ranks = 2, 256, 8, 3, 2
    ids = kv.balanced((batch, experts, seq), k, dim=1)  # experts along dim 1
    assert ids.shape == (batch, k, seq)
    counts = torch.bincount(ids.movedim(1, -1).reshape(-1), minlength=experts)
    splits = counts.view(ranks, -1).sum(dim=1).tolist()  # what torchtitan's dispatcher sends each EP rank
    assert splits == [batch * seq * k // ranks] * ranks


def test_fills_factories_and_casts_keep_values_only_for_small_index_tensors() -> None:
    scores = torch.empty(6, 4, device="meta")
    out = torch.empty(6, 4, dtype=torch.int32, device="meta")
    ones = kv.after(kv.aten.ones_like.default, (scores,), {"dtype": torch.int32}, out)
    assert not ones.is_meta and ones.tolist() == [[1] * 4] * 6
    full = kv.after(kv.aten.new_full.default, (scores, [3], 9), {}, torch.empty(3, dtype=torch.int64, device="meta"))
    assert full.tolist() == [9, 9, 9]
    floats = torch.empty(6, 4, device="meta")
    assert kv.after(kv.aten.zeros_like.default, (scores,), {}, floats) is floats  # a float fill stays phantom
    big = torch.empty(kv.NUMEL + 1, dtype=torch.int64, device="meta")
    assert kv.after(kv.aten.zeros_like.default, (big,), {}, big) is big
    assert kv.on_host(kv.aten.arange.start_step, (2, 9, 3), {"device": "cuda"}) == torch.int64
    assert kv.on_host(kv.aten.full.default, ([2], 7), {}) == torch.int64  # dtype inferred from the fill
    assert kv.on_host(kv.aten.zeros.default, ([2],), {}) is None  # the default dtype: floating point
    assert kv.on_host(kv.aten.zeros.default, ([2],), {"dtype": torch.bfloat16}) is None  # an explicit float dtype
    assert kv.on_host(kv.aten.zeros.default, ([2],), {"dtype": torch.int32}) == torch.int32
    assert kv.on_host(kv.aten.zeros.default, ([kv.NUMEL + 1],), {"dtype": torch.int32}) is None  # too big
    assert kv.casts_to_index({"dtype": torch.bool}) and not kv.casts_to_index({"dtype": torch.bfloat16})


def test_a_float_fill_cast_to_integers_has_values_until_it_is_written_to() -> None:
    logits = torch.empty(5, 4, device="meta")
    logits._phantora_fill = (0.0, logits._version)  # what `mark_fill` leaves on a zeros_like's wrapper
    cast = kv.after(kv.TO_COPY, (logits,), {"dtype": torch.int32}, torch.empty(5, 4, dtype=torch.int32, device="meta"))
    assert not cast.is_meta and cast.tolist() == [[0] * 4] * 5
    logits.add_(1)  # written to: its fill is no longer known
    again = kv.after(kv.TO_COPY, (logits,), {"dtype": torch.int32}, torch.empty(5, 4, dtype=torch.int32, device="meta"))
    assert again.is_meta


def test_masked_select_of_phantom_data_is_a_gather_of_the_masks_count() -> None:
    mask = torch.tensor([[True, False, True], [False, False, True]])
    func, args, _ = kv.masked_select_as_gather(torch.empty(2, 3, device="meta"), mask)
    assert func is kv.aten.index_select.default and args[2].shape == (3,) and args[0].is_meta
    assert kv.masked_select_as_gather(torch.empty(2, 3, device="meta"), mask.to("meta")) is None


def test_an_op_on_index_data_growing_past_numel_runs_phantom() -> None:
    """Broadcasting two index vectors of n into an n x n mask: phantom past NUMEL elements (n = 8192: 67 M booleans,
    a whole attention mask), values below (n = 64); an op not growing its input keeps its values whatever the size
    (a host copy of token ids); one whose shape depends on the values (nonzero) cannot run on meta and keeps them."""
    ge = torch.ops.aten.ge.Tensor

    def vectors(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(n, 1, dtype=torch.int64, device="meta"), torch.empty(1, n, dtype=torch.int64, device="meta")

    assert 8192 * 8192 > kv.NUMEL >= 64 * 64
    assert kv.too_large(ge, vectors(8192), {})
    assert not kv.too_large(ge, vectors(64), {})
    ids = torch.empty(kv.NUMEL + 1, dtype=torch.int64, device="meta")
    assert not kv.too_large(torch.ops.aten.add.Tensor, (ids, ids), {})
    assert not kv.too_large(torch.ops.aten.nonzero.default, (torch.empty(5000, 5000, device="meta"),), {})


@pytest.mark.slow
def test_a_phantom_rank_keeps_no_values_for_a_whole_attention_mask(tmp_path: Path) -> None:
    """On the simulated GPU in phantom mode: the 64 x 64 comparison of `arange` slices counts 64 x 65 / 2 = 2,080
    (values), the 8192 x 8192 one is phantom (its count cannot be read: PhantomValueError), so the rank never holds
    the 67 M booleans (nor the int64 sum's 512 MiB) a GPU would hold in its own memory."""
    out = tmp_path / "seen.json"
    script = SCRIPT.with_name("phantom_index_growth.py")
    launch(RunConfig(str(script), [str(out)], "testbed16", nproc=1, tensors="phantom", trace="none", timeout_s=300))
    seen = json.loads(out.read_text())
    assert (seen["small"], seen["big"], seen["shape"]) == (64 * 65 // 2, "phantom", [8192, 8192])
    assert seen["maxrss_mib"] < 8192 * 8192 * 8 / 2**20  # below the int64 sum's input alone (512 MiB)


def test_the_arguments_an_op_writes_into() -> None:
    assert kv.written(torch.ops.aten.add_.Tensor) == ((0,), ("self",))
    assert kv.written(torch.ops.aten.add.Tensor) == ((), ())


@pytest.mark.slow
def test_a_phantom_rank_runs_both_routers_on_balanced_routing(tmp_path: Path) -> None:
    """tests/scripts/phantom_routing.py on one phantom rank (about 20 s): T = 48 tokens, E = 8, k = 2."""
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, tensors="phantom", trace="none", timeout_s=300))
    seen = json.loads(out.read_text())
    tokens, experts, k = 48, 8, 2
    share = tokens * k // experts
    assert seen["scores_phantom"]
    titan = seen["titan"]
    assert titan["counts"] == [share] * experts and titan["top_scores_phantom"]
    assert titan["starts"] == [share * e for e in range(experts)] and titan["seg_len"] == tokens * k
    assert titan["split_cpu"] == [tokens * k // 2] * 2
    # argsort (stable) of the flat choices: expert 0 is chosen by tokens 0, 4, 8, ... at position 0 of k
    assert titan["order_first"] == [0, experts, 2 * experts, 3 * experts]
    mega = seen["megatron"]
    assert mega["tokens_per_expert"] == [share, share] and mega["num_out_tokens"] == 2 * share
    assert mega["local_probs_shape"] == [2 * share] and mega["local_probs_phantom"]
    assert seen["written_fill_cast_phantom"]
    assert seen["factories"] == {
        "zeros": [0, 0, 0],
        "full": [7, 7],
        "arange": [2, 5, 8],
        "ones_like": [1] * experts,
        "new_full": [5, 5],
        "float_zeros_phantom": True,
    }
    assert seen["stale"] == "PhantomValueError"  # phantom counts added in place: no stale zeros
    results = json.loads((tmp_path / "out" / "results.json").read_text()) if (tmp_path / "out").exists() else None
    assert results is None or results.get("moe_routing") == "balanced"


def test_the_routing_is_recorded_and_named_once_in_the_summary() -> None:
    from phantora.perfmodel.gpus import get_gpu
    from phantora.results.summary import format_summary, summarize

    ranks = {r: {"rank": r, "step_ends_ns": [1000, 2000], "end_ns": 2000} for r in range(2)}
    assert "moe_routing" not in summarize(ranks, get_gpu("h100"))  # no top-k of phantom scores: nothing assumed
    ranks[0]["moe_routing"] = ranks[1]["moe_routing"] = kv.ROUTING
    summary = summarize(ranks, get_gpu("h100"))
    assert summary["moe_routing"] == "balanced"
    assert format_summary(summary).count("phantom mode: MoE routing assumed balanced") == 1


def _topk_from(path: str, function: str, scores: torch.Tensor, k: int, dim: int = -1) -> torch.Tensor:
    """The indices phantom mode gives a top-k of phantom `scores` called from `function` of a module at `path` (the
    call site decides whether it is an MoE router's)."""
    source = f"def {function}(after, op, scores, k, dim, out):\n    return after(op, (scores, k, dim), {{}}, out)[1]\n"
    space: dict = {}
    exec(compile(source, path, "exec"), space)
    return space[function](kv.after, kv.TOPK, scores, k, dim, torch.topk(scores, k, dim))


@pytest.fixture
def fresh_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv, "_sites", {"balanced": {}, "phantom": {}, "limited": {}})
    monkeypatch.setattr(kv, "_routed", False)
    monkeypatch.setattr(grouped_routing, "_chosen", None)


MOE_UTILS = "/x/megatron/core/transformer/moe/moe_utils.py"


@pytest.mark.usefixtures("fresh_sites")
def test_only_a_routers_top_k_takes_the_balanced_rule() -> None:
    """torchtitan's router (`models/common/moe.py`, along the experts) and Megatron's (`moe_utils.py`) take it;
    a sampler's top-k over a vocabulary and Megatron's capacity top-k over tokens (dim 0, in moe_utils.py) keep
    phantom indices, so reading them stops in one line instead of answering with an invented routing."""
    scores = torch.empty(48, 8, device="meta")
    titan = _topk_from("/x/torchtitan/models/common/moe.py", "forward", scores, 2)
    assert not titan.is_meta and torch.equal(titan, kv.balanced((48, 8), 2))
    mega = _topk_from(MOE_UTILS, "topk_routing_with_score_function", scores, 2, dim=1)
    assert torch.equal(mega, kv.balanced((48, 8), 2))
    assert _topk_from("/x/generate/sample.py", "sample_top_k", torch.empty(4, 1000, device="meta"), 50).is_meta
    assert _topk_from(MOE_UTILS, "apply_router_token_dropping", scores, 12, dim=0).is_meta
    found = kv.sites()
    assert found is not None and kv.routing() == "balanced"
    assert [s.split(" ")[0].rsplit(":", 1)[0] for s in found["balanced"]] == [
        "models/common/moe.py",
        "transformer/moe/moe_utils.py",
    ]
    assert sorted(s.split(" (")[1] for s in found["phantom"]) == ["apply_router_token_dropping)", "sample_top_k)"]
    assert "grouped" not in found


@pytest.mark.usefixtures("fresh_sites")
def test_a_sampler_alone_assumes_no_routing() -> None:
    assert _topk_from("/x/generate/sample.py", "sample_top_k", torch.empty(4, 1000, device="meta"), 50).is_meta
    assert kv.routing() is None and kv.sites() == {"phantom": ["x/generate/sample.py:2 (sample_top_k)"]}


def _group_limited(path: str, group_fn: str, final_fn: str, rows: tuple[int, ...], e: int, g: int, kg: int, k: int):
    """The op sequence both libraries run in phantom mode: a top-2 inside each group and the group top-k (in the
    group function), then the final top-k of the masked scores (in `final_fn`); the final top-k's indices."""
    _topk_from(path, group_fn, torch.empty(*rows, g, e // g, device="meta"), 2)
    _topk_from(path, group_fn, torch.empty(*rows, g, device="meta"), kg)
    return _topk_from(path, final_fn, torch.empty(*rows, e, device="meta"), k)


def _assert_group_limited(ids: torch.Tensor, e: int, g: int, kg: int, k: int) -> None:
    """The closed forms: a token's k distinct experts lie in min(k, kg) groups, the ones its group top-k chose
    (balanced: token r's groups (r kg + j) mod G), and each expert gets T k / E of the T tokens' choices."""
    flat = ids.reshape(-1, k)
    tokens = flat.shape[0]
    chosen = kv.balanced((tokens, g), kg)
    for r, row in enumerate(flat.tolist()):
        assert len(set(row)) == k
        assert {x // (e // g) for x in row} == set(chosen[r].tolist()[: min(k, kg)])
    assert torch.bincount(flat.reshape(-1), minlength=e).tolist() == [tokens * k // e] * e


@pytest.mark.usefixtures("fresh_sites")
@pytest.mark.parametrize(("tokens", "e", "g", "kg", "k"), [(64, 64, 8, 2, 4), (128, 256, 8, 4, 8), (48, 16, 4, 3, 3)])
def test_megatron_group_limited_topk_picks_within_its_groups(tokens: int, e: int, g: int, kg: int, k: int) -> None:
    """Megatron's `group_limited_topk` (its three top-k in one function); (128, 256, 8, 4, 8) is DeepSeek-V3's
    routing (256 experts on 8 nodes, a token's 8 experts on at most 4 nodes). The run names the final top-k's site."""
    ids = _group_limited(MOE_UTILS, "group_limited_topk", "group_limited_topk", (tokens,), e, g, kg, k)
    _assert_group_limited(ids, e, g, kg, k)
    found = kv.sites()
    assert found is not None and found["limited"] == ["transformer/moe/moe_utils.py:2 (group_limited_topk)"]
    run = {"world_size": 2, "gpu": "H100", "end_ns": 1, "steps": []}
    lines = format_summary({**run, "moe_routing": "balanced", "moe_routing_sites": found})
    assert lines.count("group-limited routing") == 1 and "within its chosen groups" in lines
    assert "not modelled" not in lines


@pytest.mark.usefixtures("fresh_sites")
def test_torchtitan_node_limited_routing_picks_within_the_chosen_groups() -> None:
    """torchtitan: the group top-k in `_get_node_limited_routing_scores`, the final top-k in the router's `forward`
    (batch 2 x 32 tokens, 64 experts in 8 groups, top-4 over top-2 groups)."""
    titan = "/x/torchtitan/models/common/moe.py"
    ids = _group_limited(titan, "_get_node_limited_routing_scores", "forward", (2, 32), 64, 8, 2, 4)
    assert ids.shape == (2, 32, 4)
    _assert_group_limited(ids, 64, 8, 2, 4)
    found = kv.sites()
    assert found is not None and found["limited"] == ["models/common/moe.py:2 (forward)"]
    # a later top-k over the same tokens without a group top-k before it is balanced over all experts again
    again = _topk_from(titan, "forward", torch.empty(2, 32, 64, device="meta"), 4)
    assert torch.equal(again, kv.balanced((2, 32, 64), 4))


@pytest.mark.usefixtures("fresh_sites")
def test_a_group_top_k_without_its_final_top_k_is_named_as_not_modelled() -> None:
    """A group top-k (over 8 groups) followed by no top-k over the same 64 tokens' experts: said in one line."""
    _topk_from(MOE_UTILS, "group_limited_topk", torch.empty(64, 8, device="meta"), 2)
    other = _topk_from(MOE_UTILS, "group_limited_topk", torch.empty(32, 64, device="meta"), 4)  # other tokens
    assert torch.equal(other, kv.balanced((32, 64), 4))
    found = kv.sites()
    assert found is not None and "limited" not in found and found["grouped"]
    run = {"world_size": 2, "gpu": "H100", "end_ns": 1, "steps": []}
    lines = format_summary({**run, "moe_routing": "balanced", "moe_routing_sites": found})
    assert lines.count("group-limited routing") == 1 and "not modelled" in lines


@pytest.mark.parametrize(("ranks", "reached"), [(8, 2), (64, 4)])
def test_the_ep_traffic_of_group_limited_routing(ranks: int, reached: int) -> None:
    """T = 64 tokens on one EP rank, 64 experts in G = 8 groups, top-4 over top-2 groups, hidden 128 in bf16.
    With one EP rank a group (P = G, device-limited routing), a token reaches kg = 2 ranks; with one expert a rank
    (P = E), k = 4. From the routing map: Megatron's all-to-all sends a token once per chosen expert, T k / P to
    each rank (x hidden x 2 B); sent once per rank reached (DeepEP's dedup), T x reached / P."""
    tokens, e, g, kg, k, hidden = 64, 64, 8, 2, 4, 128
    ids = grouped_routing.within_groups(kv.balanced((tokens, g), kg), e // g, k)
    routing_map = torch.zeros(tokens, e, dtype=torch.bool).scatter_(1, ids, True)
    per_rank = routing_map.view(tokens, ranks, e // ranks)
    assert per_rank.any(dim=-1).sum(dim=1).tolist() == [reached] * tokens
    sent = per_rank.sum(dim=(0, 2)) * hidden * 2
    assert sent.tolist() == [tokens * k // ranks * hidden * 2] * ranks
    assert per_rank.any(dim=-1).sum(dim=0).tolist() == [tokens * reached // ranks] * ranks


@pytest.mark.slow
def test_the_real_group_limited_routers_pick_within_the_chosen_groups(tmp_path: Path) -> None:
    """tests/scripts/phantom_group_routing.py on one phantom rank (about 25 s): megatron-core's `group_limited_topk`
    and torchtitan's `TokenChoiceTopKRouter` (node-limited) as installed, T = 64 tokens, 64 experts in 8 groups,
    top-4 over top-2 groups; the run names the final top-k sites once."""
    out = tmp_path / "seen.json"
    report = launch(
        RunConfig(str(GROUP_SCRIPT), [str(out)], "testbed16", nproc=1, tensors="phantom", trace="none", timeout_s=300)
    )
    seen = json.loads(out.read_text())
    assert seen["scores_phantom"]
    for router in ("megatron", "titan"):
        _assert_group_limited(torch.tensor(seen[router]), 64, 8, 2, 4)
    found = report.summary["moe_routing_sites"]
    assert [s.split(" (")[1] for s in found["limited"]] == ["TokenChoiceTopKRouter.forward)", "group_limited_topk)"]
    assert format_summary(report.summary).count("within its chosen groups") == 1


@pytest.mark.usefixtures("fresh_sites")
def test_a_gate_class_is_a_router_and_an_aggregate_is_not() -> None:
    """DeepSeek-V3's reference model routes in `Gate.forward` of a plain `model.py`: balanced, as every router's
    (48 tokens x top-2 over 8 experts: 12 each); a top-k in `aggregate` or in a `Gated` MLP's forward stays phantom."""
    scores = torch.empty(48, 8, device="meta")
    space: dict = {}
    source = (
        "class Gate:\n    @staticmethod\n    def forward(after, op, scores, k, dim, out):\n"
        "        return after(op, (scores, k, dim), {}, out)[1]\n"
        "def aggregate(after, op, scores, k, dim, out):\n    return after(op, (scores, k, dim), {}, out)[1]\n"
    )
    exec(compile(source, "/x/inference/model.py", "exec"), space)
    picked = space["Gate"].forward(kv.after, kv.TOPK, scores, 2, -1, torch.topk(scores, 2))
    assert torch.bincount(picked.reshape(-1), minlength=8).tolist() == [12] * 8
    assert space["aggregate"](kv.after, kv.TOPK, scores, 2, -1, torch.topk(scores, 2)).is_meta
    assert _topk_from("/x/inference/model.py", "gated_forward", scores, 2).is_meta
