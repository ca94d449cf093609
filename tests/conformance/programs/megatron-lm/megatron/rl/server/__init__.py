# Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
from .inference.inference_interface_server import *
