"""The packet config a command line asks for, built in one place for `run`, `replay` and `netsim`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.netsim import cc_registry
from phantora.netsim.packet_config import PacketConfig, apply_overrides, read_hpcc_config

FLOW_FIELDS = ("ecmp_hash", "lb")  # the PacketConfig fields the flow network honours too (lb: docs/flow-engine.md)
# Every command (run, replay, netsim, and so sweep) samples switch queues every 1 us unless told otherwise
# (`--queue-sample-ns N`, 0 = off); the engine API's own default, PacketConfig.queue_sample_ns, stays 0. 1 us
# resolves a base RTT at 100-800G; its cost is in docs/packet-model.md ("Queue sampling").
QUEUE_SAMPLE_NS = 1000
QUEUE_SAMPLE_HELP = f"sample switch queues every N ns into queues.csv, 0 = off (ns3 only; default {QUEUE_SAMPLE_NS})"


def packet_config_from_flags(
    *,
    cc: str | None = None,
    sets: Sequence[str] = (),
    config_file: str | Path | None = None,
    queue_sample_ns: int | None = None,
    seed: int | None = None,
    base: PacketConfig | None = None,
) -> PacketConfig:
    """`base` (default: the HPCC defaults, queues sampled every QUEUE_SAMPLE_NS unless decomposed), then an HPCC
    `--config` file, `--cc`, `--queue-sample-ns`, `--seed` and the `--set FIELD=VALUE` overrides, in that order.
    Errors name the file or field. A CC other than none, or any CC attribute, is checked against the library's
    registry (`cc_registry`, which builds the ns-3 models first if needed)."""
    explicit = queue_sample_ns is not None or any(i.partition("=")[0].strip() == "queue_sample_ns" for i in sets)
    config = base or PacketConfig()
    if config_file:
        config = read_hpcc_config(config_file, config)
    if cc:  # a config file's attributes of another CC do not apply to this one
        own = cc_registry.lookup(cc, field="--cc").attributes
        config = config.with_updates(cc=cc, cc_attrs={k: v for k, v in config.cc_attrs.items() if k in own})
    if queue_sample_ns is not None:
        config = config.with_updates(queue_sample_ns=queue_sample_ns)
    if seed is not None:
        config = apply_overrides(config, [f"seed={seed}"], source="--seed")  # checked as --set seed=S is
    if sets:
        config = apply_overrides(config, sets)
    if base is None and not explicit and not config.workers:  # decomposed runs do not sample queues
        config = config.with_updates(queue_sample_ns=QUEUE_SAMPLE_NS)
    if config.cc != "none" or config.cc_attrs:
        cc_registry.check(config.cc, config.cc_attrs, source="--set" if sets else None)
    return config


def check_flow_sets(sets: Sequence[str], allowed: Sequence[str] = FLOW_FIELDS) -> None:
    """Every `--set FIELD=VALUE` item names a field the flow network honours (`allowed`); else an error naming it."""
    for item in sets:
        key = item.partition("=")[0].strip()
        if key not in allowed:
            raise InputError(
                f"applies to --network ns3 only (the flow network takes --set {', '.join(allowed)} only)",
                file="--set",
                field=key,
            )


def flow_options_from_sets(sets: Sequence[str]) -> dict[str, Any]:
    """The flow engine's options from `--set FIELD=VALUE` items: the fields it honours (`FLOW_FIELDS`); any
    other field is an error naming it."""
    check_flow_sets(sets)
    config = apply_overrides(PacketConfig(), sets)
    out: dict[str, Any] = {"ecmp_hash": config.ecmp_hash} if config.ecmp_hash else {}
    if config.lb != "ecmp":
        out["lb"] = config.lb
    return out
