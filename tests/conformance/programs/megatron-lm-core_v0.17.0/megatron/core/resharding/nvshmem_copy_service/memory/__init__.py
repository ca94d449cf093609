# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.

"""Memory management utilities for NVSHMEM operations."""

from .double_buffer_manager import DoubleBufferManager
from .tensor_pointer_utils import TensorPointerExtractor

__all__ = ["DoubleBufferManager", "TensorPointerExtractor"]
