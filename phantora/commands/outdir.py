"""`--out` and `--overwrite`, the same on every command that writes a run directory (run, replay, netsim)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from phantora.results import run_dir


def add_out_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", "-o", type=Path, default=None, help=f"write {what} into this new directory")
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
        args.out = run_dir.claim(args.out, overwrite=args.overwrite)
        run_dir.write_status(args.out, "running", command=command)
        try:
            rc = body(args)
        except BaseException as exc:
            run_dir.write_status(args.out, "failed", command=command, **run_dir.failure(exc))
            raise
        run_dir.write_status(args.out, "complete" if rc == 0 else "failed", command=command, exit_code=rc)
        return rc

    return run
