"""`phantora cc`: the congestion controls `--cc` takes (built in, and from `$PHANTORA_CC_DIR`);
`phantora cc NAME`: one CC's attributes (`--set cc.ATTR=VALUE`), with their types, defaults and help."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cc", help="list the congestion controls and their attributes", description=__doc__)
    p.add_argument("name", nargs="?", help="show this CC's attributes (default: list every CC)")
    p.add_argument("--json", action="store_true", help="print the registry as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from phantora.netsim import cc_registry
    from phantora.netsim.ns3_build import cc_library
    from phantora.netsim.packet_config import TRANSPORT_PRESETS

    known = cc_registry.registry()
    chosen = [cc_registry.lookup(args.name, field="NAME")] if args.name else [known[n] for n in sorted(known)]
    if args.json:
        out = {
            c.name: {
                "typeid": c.typeid,
                "wants_int": c.wants_int,
                "attributes": {a: vars(v) for a, v in sorted(c.attributes.items())},
            }
            for c in chosen
        }
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    if not args.name:
        extra = cc_library()
        print("congestion controls (--cc NAME):" + (f" (with {extra})" if extra else ""))
        for c in chosen:
            print(f"  {c.name:<10} {c.typeid:<18} {', '.join(sorted(c.attributes)) or '-'}")
        print("phantora cc NAME shows one's attributes; set them with --set cc.ATTR=VALUE")
        print("transports (--set transport=NAME, the CC and the rest of the transport at once):")
        for name, preset in TRANSPORT_PRESETS.items():
            fields = " ".join(f"{k}={_text(v)}" for k, v in preset.items())
            print(f"  {name:<10} {fields}")
        return 0
    c = chosen[0]
    print(f"{c.name} ({c.typeid}){'; stamps INT' if c.wants_int else ''}: --set cc.ATTR=VALUE")
    for name, a in sorted(c.attributes.items()):
        print(f"  {name:<22} {a.kind.removeprefix('ns3::').removesuffix('Value'):<9} default {a.default:<12} {a.help}")
    return 0


def _text(value: object) -> str:
    """A preset field's value as `--set` takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "default" if value is None else str(value)
