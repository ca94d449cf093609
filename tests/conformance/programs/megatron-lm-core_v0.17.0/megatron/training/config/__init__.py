# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

from megatron.training.config.common_config import (
    RNGConfig,
    ProfilingConfig,
    DistributedInitConfig,
)
from megatron.training.config.training_config import (
    TrainingConfig,
    ValidationConfig,
    SchedulerConfig,
    LoggerConfig,
    CheckpointConfig,
)
from megatron.training.config.resilience_config import (
    RerunStateMachineConfig,
    StragglerDetectionConfig,
)
