# Copyright (c) 2026, NVIDIA CORPORATION. All rights reserved.
