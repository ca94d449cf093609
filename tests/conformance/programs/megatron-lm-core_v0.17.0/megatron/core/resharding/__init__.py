# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.
from .execution import execute_reshard_plan
from .planner import build_centralized_reshard_plan
from .refit import (
    clear_service_cache,
    get_or_create_service,
    reshard_model_weights,
    swap_model_weights,
)
from .transforms import MXFP8ReshardTransform, ReshardTransform
from .utils import ParameterMetadata, ReshardPlan, ShardingDescriptor, TransferOp

__all__ = [
    "build_centralized_reshard_plan",
    "execute_reshard_plan",
    "MXFP8ReshardTransform",
    "ReshardTransform",
    "swap_model_weights",
    "reshard_model_weights",
    "get_or_create_service",
    "clear_service_cache",
    "ParameterMetadata",
    "ShardingDescriptor",
    "TransferOp",
    "ReshardPlan",
]
