# Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
