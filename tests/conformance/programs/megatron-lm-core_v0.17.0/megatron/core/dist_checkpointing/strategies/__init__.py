# Copyright (c) 2022-2023, NVIDIA CORPORATION.  All rights reserved.
