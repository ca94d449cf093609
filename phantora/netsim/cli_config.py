"""The engine a command line asks for (`EngineSpec`), built in one place: run, replay, netsim, nccl-tests, jobs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.netsim import cc_registry
from phantora.netsim.engine_spec import DEFAULT_WINDOW_NS, FLOW_FIELDS, EngineSpec
from phantora.netsim.packet_config import PacketConfig, apply_overrides, read_hpcc_config

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
    """`base` (default: the HPCC defaults, queues sampled every QUEUE_SAMPLE_NS unless decomposed or partitioned),
    then an HPCC `--config` file, `--cc`, `--queue-sample-ns`, `--seed` and the `--set FIELD=VALUE` overrides, in
    that order. Errors name the file or field. A CC other than none, or any CC attribute, is checked against the
    library's registry (`cc_registry`, which builds the ns-3 models first if needed)."""
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
    if base is None and not explicit and not config.workers and not config.partition:  # nor do partition workers
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


def check_flow_network(network: str, cc: str | None, sets: Sequence[str], allowed: Sequence[str] = FLOW_FIELDS) -> None:
    """With the flow network, `--cc` and `--set` of a field it does not honour are errors, on every command."""
    if network != "flow":
        return
    if cc:
        raise InputError("applies to --network ns3 only (the flow network has no congestion control)", field="--cc")
    check_flow_sets(sets, allowed)


def engine_spec_from_flags(
    network: str,
    *,
    window_ns: int | None = None,
    scenario: str | Path | None = None,
    flow_fields: Sequence[str] = FLOW_FIELDS,
    flow_goodput: bool = False,
    **flags: Any,
) -> EngineSpec:
    """The `EngineSpec` of `--network`, the packet flags (`flags`: `packet_config_from_flags`'s cc, sets,
    config_file, queue_sample_ns, seed), the window (None: `DEFAULT_WINDOW_NS`) and `--scenario`. The flow network
    refuses `--cc` and any `--set` field outside `flow_fields` (its packet config, which it reads `flow_fields` of,
    is built as ns3's is). Errors name the flag and field."""
    check_flow_network(network, flags.get("cc"), flags.get("sets", ()), flow_fields)
    window = DEFAULT_WINDOW_NS if window_ns is None else window_ns
    return EngineSpec(
        network=network,
        packet=packet_config_from_flags(**flags),
        window_ns=window,
        scenario=None if scenario is None else str(scenario),
        flow_goodput=flow_goodput,
    )


def engine_spec_from_args(args: argparse.Namespace, **given: Any) -> EngineSpec:
    """`engine_spec_from_flags` of a command's parsed options (--network, --cc, --set, --queue-sample-ns, --seed,
    --scenario: those it has), with `given` on top (a command's own: window_ns, config_file, flow_fields ...). A
    scenario goes to the flow network's engine only unless `given` names it (replay and netsim hand ns-3 theirs
    when they build it; `phantora run` gives it to either network's engine)."""
    network = args.network
    flags: dict[str, Any] = {"cc": args.cc, "sets": args.set or (), "seed": getattr(args, "seed", None)}
    flags["queue_sample_ns"] = getattr(args, "queue_sample_ns", None)
    flags["scenario"] = getattr(args, "scenario", None) if network == "flow" else None
    return engine_spec_from_flags(network, **{**flags, **given})
