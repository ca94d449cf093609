"""The packet config a command line asks for, built in one place for `run`, `replay` and `netsim`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.netsim.packet_config import CC_ATTRIBUTES, PacketConfig, apply_overrides, read_hpcc_config

FLOW_FIELDS = ("ecmp_hash",)  # the PacketConfig fields the flow network honours too


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


def flow_options_from_sets(sets: Sequence[str]) -> dict[str, Any]:
    """The flow engine's options from `--set FIELD=VALUE` items: the fields it honours (`FLOW_FIELDS`); any
    other field is an error naming it."""
    for item in sets:
        key = item.partition("=")[0].strip()
        if key not in FLOW_FIELDS:
            raise InputError(
                f"applies to --network ns3 only (the flow network takes --set {', '.join(FLOW_FIELDS)} only)",
                file="--set",
                field=key,
            )
    config = apply_overrides(PacketConfig(), sets)
    return {"ecmp_hash": config.ecmp_hash} if config.ecmp_hash else {}
