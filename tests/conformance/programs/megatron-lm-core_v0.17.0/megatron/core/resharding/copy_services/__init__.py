# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.
from __future__ import annotations

from .base import CopyService
from .nccl_copy_service import NCCLCopyService
from .nvshmem_copy_service import NVSHMEMCopyService

__all__ = ["CopyService", "NCCLCopyService", "NVSHMEMCopyService"]
