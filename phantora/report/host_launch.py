"""The host's launch of one GPU's NCCL call: its owner is phantora/collectives/nccl/host_launch.py (the runtime charges
it too, and may not import this layer); re-exported here for nccl-tests' report and its callers."""

from phantora.collectives.nccl.host_launch import (
    DEFAULT_BATCHES,
    HOST_CHANNEL_US,
    HOST_LAUNCH_US,
    host_launch_us,
    host_ns_per_call,
    work_batches,
)

__all__ = ["DEFAULT_BATCHES", "HOST_CHANNEL_US", "HOST_LAUNCH_US", "host_launch_us", "host_ns_per_call", "work_batches"]
