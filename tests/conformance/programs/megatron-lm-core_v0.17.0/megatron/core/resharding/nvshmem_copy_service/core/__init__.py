# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.

"""Core execution components for NVSHMEM operations."""

from .gpu_resource_manager import GPUResourceManager
from .kernel_launcher import KernelLauncher
from .pipeline_executor import PipelineExecutor

__all__ = ["GPUResourceManager", "KernelLauncher", "PipelineExecutor"]
