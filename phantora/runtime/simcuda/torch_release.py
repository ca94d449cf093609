"""The torch release a run stands for (PHANTORA_TORCH_VERSION), for the kernels that differ between releases.

A simulated GPU runs the aten ops of the installed torch, but which of them a CUDA build has a fused kernel for
depends on the release: a program measured on an older torch is charged as that torch ran it on its GPU.

- ``aten._fused_rms_norm`` (torch's RMSNorm, ``torch.nn.RMSNorm`` / ``F.rms_norm``) has a CUDA kernel from torch 2.9
  (pytorch/pytorch#153666, merged to main in August 2025, after 2.8's branch cut; first released in 2.9.0,
  2025-10-15). Before it, a CUDA tensor's RMSNorm ran as ``rms_norm``'s composite: its elementwise and reduction
  ops forward, and autograd's backward of each.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from phantora.errors import InputError

VAR = "PHANTORA_TORCH_VERSION"
FUSED_RMS_NORM = (2, 9)
"""The first torch release whose CUDA build runs RMSNorm as one fused kernel each way."""


def installed() -> tuple[int, int]:
    """The (major, minor) of the torch this process runs."""
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    assert m is not None, torch.__version__
    return int(m.group(1)), int(m.group(2))


def modelled(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """PHANTORA_TORCH_VERSION (`2.5`, `2.5.1`, `2.6.0.dev20241015`...): the (major, minor) of the torch that ran the
    program being modelled; unset: the installed torch."""
    env = os.environ if env is None else env
    text = env.get(VAR, "").strip().lstrip("v")
    if not text:
        return installed()
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?[A-Za-z0-9.+-]*)?", text)
    if m is None:
        raise InputError(f"{VAR}={text!r} is not a torch version such as 2.5.1", field=VAR)
    return int(m.group(1)), int(m.group(2))


def fuses_rms_norm(version: tuple[int, int]) -> bool:
    """Whether torch `version`'s CUDA build runs RMSNorm as one fused kernel (`FUSED_RMS_NORM`)."""
    return version >= FUSED_RMS_NORM
