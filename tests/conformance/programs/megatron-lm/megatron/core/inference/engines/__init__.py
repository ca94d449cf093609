# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

from .abstract_engine import AbstractEngine
from .dynamic_engine import DynamicInferenceEngine, EngineSuspendedError
from .static_engine import StaticInferenceEngine
