# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.

"""Planning components for task segmentation, workload packing, and scheduling."""

from .communication_scheduler import CommunicationScheduler
from .gpu_execution_planner import GPUExecutionPlanner
from .task_segmenter import TaskSegmenter
from .workload_packer import WorkloadPacker

__all__ = ["CommunicationScheduler", "GPUExecutionPlanner", "TaskSegmenter", "WorkloadPacker"]
