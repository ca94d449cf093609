"""The published NCCL tables by name (phantora.collectives.nccl.published) and the platform each was measured on,
for the tuner tests."""

from __future__ import annotations

from phantora.collectives.nccl.platform import Platform, platform_of
from phantora.collectives.nccl.published import machine, tables

BY_NAME = {t.name: t for t in tables(include_degraded=True)}  # the tuner tests also read tables not compared


def table_platform(name: str) -> Platform:
    """The platform of the published table `name`: its machine, every one of its GPUs."""
    table = BY_NAME[name]
    return platform_of(machine(table), tuple(range(table.gpus)))
