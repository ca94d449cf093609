"""`--seed S` and `--seeds N`, the same on `run`, `replay` and `netsim`: one run per seed, and their spread.

The seed is the packet network's random seed (PacketConfig.seed: the switches' ECN marking draws, so DCQCN
and RED marking vary with it); the flow network has nothing random, so its seeds give identical runs.
`--seeds N --out D` runs seeds S, S+1, ..., S+N-1 (S = --seed, default 1) into D/seed<S>/, each a complete
run directory, and lists them in D/seeds.json (schema phantora.seeds/1), which `phantora compare D ...` and
`phantora.results.read.load_run` read as one seed group: the mean and spread over the seeds.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.netsim.engine_warnings import told_once
from phantora.results import schema as S
from phantora.results.run_dir import RunDir

SPREAD_METRICS: tuple[str, ...] = (
    "time_ns",
    "fct_p50_ns",
    "fct_p99_ns",
    "slowdown_p99",
    "net_fct_p50_ns",
    "net_fct_p99_ns",
    "net_slowdown_p99",
    "pfc_paused_ns",
    "queue_max_bytes",
)
SPREAD_METRICS += ("ecn_marks", "cnps")


def add_seed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="S",
        help="random seed of the packet network's ECN marking draws (ns3; default 1; the flow network is "
        "deterministic)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="repeat the run with N seeds (S, S+1, ...): --out gets a run directory per seed (seed<S>/) and "
        "seeds.json; the mean and spread are printed, and compare and sweep show them",
    )


def with_seeds(command: str, body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`body(args)` once, or with `--seeds N` once per seed into OUT/seed<S>/, then OUT/seeds.json and the spread."""

    def run(args: argparse.Namespace) -> int:
        n = getattr(args, "seeds", None)
        if n is None:
            return body(args)
        if n < 1:
            raise InputError(f"expected a number of seeds >= 1, got {n}", field="--seeds")
        if args.out is None:
            raise InputError("--seeds needs --out: each seed's run gets a directory of its own", field="--seeds")
        first = 1 if args.seed is None else args.seed
        if first < 1:
            raise InputError(f"a seed is a positive integer, got {first}", field="--seed")
        out = RunDir.claim(args.out, overwrite=args.overwrite)
        if args.network == "flow":
            print(f"note: the flow network is deterministic: the {n} seeds give identical runs")
        with told_once():
            return _each_seed(args, body, command, out, first, n)

    return run


def _each_seed(
    args: argparse.Namespace,
    body: Callable[[argparse.Namespace], int],
    command: str,
    out: RunDir,
    first: int,
    n: int,
) -> int:
    """`with_seeds`' loop: seed by seed into OUT/seed<S>/, then OUT/seeds.json and the spread."""
    done: list[dict[str, Any]] = []
    for i, seed in enumerate(range(first, first + n)):
        print(f"[phantora] seed {seed} ({i + 1} of {n}) -> {out.seed(seed).root}", flush=True)
        one = copy.copy(args)
        one.seed, one.seeds, one.out = seed, None, out.seed(seed).root
        try:
            rc = body(one)
        except BaseException:
            _write_group(out, command, done, first, n, "failed")
            raise
        if rc != 0:
            _write_group(out, command, done, first, n, "failed")
            return rc
        done.append({"seed": seed, "dir": f"seed{seed}"})
        _write_group(out, command, done, first, n, "complete" if len(done) == n else "running")
    print(format_spread(out.root))
    return 0


def _write_group(out: RunDir, command: str, runs: list[dict[str, Any]], first: int, n: int, state: str) -> None:
    doc = {"schema": S.SEEDS, "command": command, "state": state, "seeds": list(range(first, first + n))}
    out.write_json(S.SEEDS_JSON, {**doc, "runs": runs}, sort_keys=False)


def format_spread(group: Path) -> str:
    """The mean, standard deviation and range of the main metrics over a seed group's runs."""
    from phantora.report.compare import SUMMARY, both_kinds, display_unit, figures, fmt_spread, fmt_value, shown
    from phantora.results.read import load_run

    run = load_run(group)
    means, spreads = figures(run)
    n = len(run.members or [])
    lines = [f"over {n} seeds: mean ±standard deviation [min-max]"]
    for key in shown(SPREAD_METRICS, both_kinds(means)):  # the network-flow rows where the runs have both kinds
        s = spreads.get(key)
        if s is None:
            continue
        label, unit, _ = SUMMARY[key]
        if key == "time_ns":
            label = "iteration time" if run.time_kind == "iteration" else "makespan"
        value = fmt_value(means[key], unit) + fmt_spread(s, unit, full=True)
        lines.append(f"  {label:<32} {display_unit(unit):>5}  {value}")
    lines.append(
        f"wrote {RunDir(group).file(S.SEEDS_JSON)} (phantora compare {group} ... shows them as one seed group)"
    )
    return "\n".join(lines)
