"""Packed sequences and CTC loss on the simulated GPU, as a CUDA build runs them (simcuda/tensor.py HOST_OUTPUTS,
cuda_only.py).

A `PackedSequence` of cuda data keeps its `batch_sizes` on the host: torch's `_pack_padded_sequence` returns it as a
CPU tensor for any device, and `nn.LSTM` refuses a packed input whose batch_sizes is not ("batch_sizes should always be
on CPU"); phantora wrapped every output as a GPU tensor, so `pack_padded_sequence` of cuda data stopped there. Closed
form: batch_sizes[t] is the number of sequences longer than t. `F.ctc_loss` of cuda tensors first asks
``_use_cudnn_ctc_loss`` / ``_use_miopen_ctc_loss``, CUDA-only checks with no CPU kernel (torch's "Could not run
'aten::_use_cudnn_ctc_loss.Tensor' with arguments from the 'CPU' backend"); without cuDNN the answer is False and
torch's own CTC kernel runs, here on the data: the CPU's loss.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from phantora.perfmodel.gpus import get_gpu
from phantora.runtime import session as session_module
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import device
from phantora.runtime.simcuda.tensor import SimCudaTensor


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[RankSession]:
    monkeypatch.setattr(device, "_installed", True)
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    session_module.install(s)
    try:
        yield s
    finally:
        session_module.install(None)


def test_a_packed_sequences_batch_sizes_and_lengths_stay_on_the_host(session: RankSession) -> None:
    lengths = [5, 3, 2]
    x = SimCudaTensor(torch.randn(3, 5, 4), 0)
    with ChargeMode(session):
        data, batch_sizes = torch._pack_padded_sequence(x, torch.tensor(lengths), True)
        padded, back = torch._pad_packed_sequence(data, batch_sizes, True, 0.0, 5)
    assert type(data) is SimCudaTensor and data.shape == (sum(lengths), 4)
    assert type(batch_sizes) is torch.Tensor and batch_sizes.device.type == "cpu"
    assert batch_sizes.tolist() == [sum(n > t for n in lengths) for t in range(max(lengths))]
    assert type(padded) is SimCudaTensor and padded.shape == (3, 5, 4)
    assert type(back) is torch.Tensor and back.device.type == "cpu" and back.tolist() == lengths


def test_ctc_loss_runs_torchs_own_kernel_without_cudnn(session: RankSession) -> None:
    torch.manual_seed(0)
    log_probs = torch.randn(12, 2, 5).log_softmax(2)
    targets = torch.randint(1, 5, (2, 4))
    lengths = (torch.tensor([12, 12]), torch.tensor([4, 3]))
    want = F.ctc_loss(log_probs, targets, *lengths)  # plain CPU
    lp, tg = SimCudaTensor(log_probs, 0), SimCudaTensor(targets, 0)
    with ChargeMode(session):
        assert torch._use_cudnn_ctc_loss(lp, tg, *lengths, 0) is False
        got = F.ctc_loss(lp, tg, *lengths)
    assert type(got) is SimCudaTensor
    torch.testing.assert_close(got.elem, want)
