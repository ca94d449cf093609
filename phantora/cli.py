"""The `phantora` command: one sub-command per module in `phantora.commands`."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import Any

from phantora.errors import PhantoraError

# Each module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
COMMANDS = (
    "topo", "replay", "netsim", "run", "rerun", "compare", "sweep", "profile", "calibrate", "cc", "doctor",
    "nccl_tests",  # the `nccl-tests` command
)  # fmt: skip


DESCRIPTION = (
    "phantora: a live GPU-cluster simulator for ML training. Each command's options: phantora COMMAND --help; "
    "the guide: README.md and docs/ of the repository (docs/cli.md: the options every command shares)."
)


class _Version(argparse.Action):
    """`--version`: looked up only when asked for (reading package metadata takes a moment)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from phantora.results.provenance import versions

        v = versions()
        ns3 = v["ns3"] or "not installed"
        print(f"phantora {v['phantora']} (torch {v['torch']}, ns-3 {ns3}, Python {v['python']})")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `phantora` parser with every command, or with the command module `only` alone (a faster start)."""
    from phantora.commands.options import Parser

    parser = Parser(prog="phantora", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version, help="print the versions of phantora, torch, ns-3, Python")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"phantora.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"phantora.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def _print_input_warnings(command: str) -> None:
    """Input phantora accepts but partly ignores: one line, "phantora CMD: warning: ...", no source line."""
    import warnings

    from phantora.errors import InputWarning

    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if issubclass(category, InputWarning):
            print(f"phantora {command}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


class Terminated(BaseException):
    """SIGTERM arrived (`timeout`, a batch scheduler, `kill`); status.json's reason names it."""

    code = "terminated"

    def __str__(self) -> str:
        return "terminated (SIGTERM)"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def command_module(argv: list[str]) -> str | None:
    """The command module the arguments name first (`nccl-tests` -> `nccl_tests`), if they name one."""
    name = argv[0].replace("-", "_") if argv else ""
    return name if name in COMMANDS and argv[0] != "nccl_tests" else None


def main(argv: list[str] | None = None) -> int:
    # only the named command's module is imported (the others import numpy, zmq, the bridge: seconds when the
    # machine is busy); `phantora --help`, `--version` and a mistyped command get the full parser
    parser = build_parser(command_module(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.command_line = ["phantora", *(sys.argv[1:] if argv is None else argv)]  # recorded in config.json
    if argv is None:  # the `phantora` program, a process of its own (not a caller's): the run's GC policy
        from phantora.netsim.gc_pause import use_run_policy

        use_run_policy()
    _print_input_warnings(args.command)
    # SIGTERM unwinds like Ctrl-C, so a run stops its processes (and theirs: DataLoader workers) on the way out
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return int(args.func(args) or 0)
    except PhantoraError as exc:
        print(f"phantora {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"phantora {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"phantora {args.command}: terminated", file=sys.stderr)
        return 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
