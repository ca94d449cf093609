"""The packet config a command line asks for, built in one place for `run`, `replay` and `netsim`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phantora.netsim.packet_config import CC_ATTRIBUTES, PacketConfig, apply_overrides, read_hpcc_config


def packet_config_from_flags(
    *,
    cc: str | None = None,
    sets: Sequence[str] = (),
    config_file: str | Path | None = None,
    queue_sample_ns: int | None = None,
    base: PacketConfig | None = None,
) -> PacketConfig:
    """`base` (default: the HPCC defaults), then an HPCC `--config` file, `--cc`, `--queue-sample-ns` and the
    `--set FIELD=VALUE` overrides, in that order. Errors name the file or field."""
    config = base or PacketConfig()
    if config_file:
        config = read_hpcc_config(config_file, config)
    if cc:  # a config file's attributes of another CC do not apply to this one
        keep = {k: v for k, v in config.cc_attrs.items() if k in CC_ATTRIBUTES.get(cc, {})}
        config = config.with_updates(cc=cc, cc_attrs=keep)
    if queue_sample_ns is not None:
        config = config.with_updates(queue_sample_ns=queue_sample_ns)
    if sets:
        config = apply_overrides(config, sets)
    return config
