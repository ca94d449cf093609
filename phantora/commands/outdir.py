"""`--out` and `--overwrite`, the same on every command that writes a run directory (run, replay, netsim), and
the config.json of `replay` and `netsim` (`record_config`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phantora.results.run_dir import RunDir

NOT_SETTINGS = ("func", "out", "overwrite", "command", "command_line", "progress", "quiet", "rerun_of")


def add_out_options(p: argparse.ArgumentParser, what: str, *, short: bool = True) -> None:
    """`--out DIR` (and `-o`, unless `short` is False: `nccl-tests` keeps -o for its reduction op) and `--overwrite`."""
    names = ("--out", "-o") if short else ("--out",)
    p.add_argument(*names, type=Path, default=None, help=f"write {what} into this new directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="--out may hold an earlier run: remove what that run wrote first (otherwise the command refuses)",
    )


def in_run_dir(command: str, body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`body(args)` with `args.out` claimed first and its status.json kept: running, complete or failed."""

    def run(args: argparse.Namespace) -> int:
        if args.out is None:
            rc = body(args)
            print(f"nothing saved: pass --out DIR to keep the results of this {command}")
            return rc
        rd = RunDir.claim(args.out, overwrite=args.overwrite)
        args.out = rd.root
        rd.running(command=command)
        try:
            rc = body(args)
        except BaseException as exc:
            rd.failed(exc, command=command)
            raise
        if rc == 0:
            rd.complete(command=command, exit_code=rc)
        else:
            rd.failed(command=command, exit_code=rc)
        return rc

    return run


def record_config(
    args: argparse.Namespace, kind: str, topo: Any, packet: Any, inputs: dict[str, str | Path | None]
) -> None:
    """config.json of a replay or netsim run directory (`phantora run` writes its own): the options as given,
    the packet settings with every default (None for the flow network), the topology, the input files by
    content (`inputs`: option name -> path), the versions, and for `phantora rerun` the run it repeats."""
    if args.out is None:
        return
    from phantora.results.provenance import write_config

    options = {k: v for k, v in vars(args).items() if k not in NOT_SETTINGS}
    write_config(args.out, options=options, topo=topo, packet=packet, command=getattr(args, "command_line", None),
                 kind=kind, inputs=inputs, rerun_of=getattr(args, "rerun_of", None))  # fmt: skip
