"""torch.distributed.pipelining in phantom mode: the schedule's warm-up vote carries its values.

Before its first step a torch 2.13 pipeline schedule votes, stage by stage, whether every stage's shapes are
static (`PipelineStage._warmup_forward_vote` sends an int32 product forward, `_warmup_backward_result` sends the
result back), and reads the result with `.item()`. Phantom tensors carry no values, so in phantom mode those two
steps run as torch writes them, with each send and recv also carrying its values through the value channel
(`object_values.send_tensor_value`): the same 4-byte transfers are timed, and every stage learns the real vote.
A DYNAMIC vote then exchanges stage metadata with `send_object_list` / `recv_object_list`, which carry values
in phantom mode too (`object_values`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from phantora.runtime import import_hooks
from phantora.runtime import session as _session
from phantora.runtime.object_values import recv_tensor_value, send_tensor_value

_MARK = "_phantora_phantom_vote"


def _phantom() -> bool:
    s = _session.current()
    return s is not None and bool(s.phantom)


def _forward_vote(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_warmup_forward_vote` (torch 2.13's logic) with value-carrying sends and recvs."""
    from torch.distributed.pipelining.stage import InferenceMode

    @functools.wraps(original)
    def vote(self: Any, has_backward: bool, received_acc: torch.Tensor | None = None) -> torch.Tensor:
        if not _phantom():
            return original(self, has_backward, received_acc)  # type: ignore[no-any-return]
        mine = 0 if InferenceMode.needs_dynamic(self._user_meta, has_backward) else 1
        my_vote = torch.tensor([mine], dtype=torch.int32, device=self.device)
        if self.is_first:
            acc = my_vote
        elif self._is_same_rank(self.stage_index - 1):
            if received_acc is None:
                raise RuntimeError("P2P warm-up voting: no vote from the previous stage on this rank")
            acc = received_acc * my_vote
        else:
            peer = self._resolve_peer_global_rank(self.stage_index - 1)
            like = torch.zeros(1, dtype=torch.int32, device=self.device)
            acc = recv_tensor_value(like, peer, self.group) * my_vote
        if not self.is_last and not self._is_same_rank(self.stage_index + 1):
            send_tensor_value(acc, self._resolve_peer_global_rank(self.stage_index + 1), self.group)
        return acc

    setattr(vote, _MARK, True)
    return vote


def _backward_result(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_warmup_backward_result` (torch 2.13's logic) with value-carrying sends and recvs."""

    @functools.wraps(original)
    def result_of(self: Any, received_result: torch.Tensor | None = None) -> torch.Tensor:
        if not _phantom():
            return original(self, received_result)  # type: ignore[no-any-return]
        if self.is_last or self._is_same_rank(self.stage_index + 1):
            if received_result is None:
                raise RuntimeError("P2P warm-up voting: no result from the next stage on this rank")
            result = received_result
        else:
            peer = self._resolve_peer_global_rank(self.stage_index + 1)
            like = torch.zeros(1, dtype=torch.int32, device=self.device)
            result = recv_tensor_value(like, peer, self.group)
        if not self.is_first and not self._is_same_rank(self.stage_index - 1):
            send_tensor_value(result, self._resolve_peer_global_rank(self.stage_index - 1), self.group)
        return result

    setattr(result_of, _MARK, True)
    return result_of


def _patch(stage: ModuleType) -> None:
    cls = getattr(stage, "PipelineStage", None)
    vote = getattr(cls, "_warmup_forward_vote", None)
    back = getattr(cls, "_warmup_backward_result", None)
    if cls is None or vote is None or back is None or getattr(vote, _MARK, False):
        return  # another torch: no warm-up vote to carry
    cls._warmup_forward_vote = _forward_vote(vote)
    cls._warmup_backward_result = _backward_result(back)


def enable() -> None:
    """Carry the pipeline warm-up vote's values in phantom mode (once torch.distributed.pipelining is imported)."""
    import_hooks.after_import("torch.distributed.pipelining.stage", _patch)
