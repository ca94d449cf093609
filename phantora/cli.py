"""The `phantora` command: one sub-command per module in `phantora.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

from phantora.errors import PhantoraError

# Each module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
COMMANDS = ("topo", "replay", "netsim", "run", "compare", "sweep", "profile", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phantora", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"phantora.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"phantora.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PhantoraError as exc:
        print(f"phantora {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"phantora {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
