"""Imported first in a rank process: load the simulated CUDA device's C++ part before torch.

torch reads its CUDA hooks once, when it is imported; the rank bootstrap and the fork server import
this module before anything imports torch. It does nothing unless ``PHANTORA_SIM_CUDA=1``.
"""

from __future__ import annotations

from phantora.runtime.simcuda.guard import preload

preload()
