# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

from .inference.contexts import (  # noqa: F401 # pylint: disable=unused-import
    StaticInferenceContext as InferenceParams,
)
