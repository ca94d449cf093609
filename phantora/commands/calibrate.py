"""`phantora calibrate TABLE.csv --gpu l40s`: fit the compute model's curves on part of a measured table
and report its error on the held-out rest, per op class (median and p90 relative error).

`phantora calibrate --public`: fit the public per-GPU model (each GPU die's kernel efficiencies, from the
published measurements of phantora/perfmodel/data/public_kernels.csv) and report, per GPU and kernel
class, the leave-one-out error of every row (predicted by a fit on its die's other rows)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from phantora.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit the GPU compute model to a measured op table", description=__doc__)
    p.add_argument("tables", nargs="*", type=Path, help="measured tables (phantora or perfdb CSV format)")
    p.add_argument("--gpu", default=None, help="GPU the table was measured on (a100, h100, h200, b200, l40s, ...)")
    p.add_argument("--public", action="store_true", help="fit and check the public per-GPU model instead")
    p.add_argument("--data", type=Path, default=None, help="--public: the data file (default: the shipped one)")
    p.add_argument("--out", "-o", type=Path, default=None, help="write the fitted curves (JSON) here")
    p.add_argument("--holdout", type=float, default=0.3, help="fraction of rows held out for testing (default 0.3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random train/test split (default 0)")
    p.add_argument("--errors", type=Path, default=None, help="write per-row held-out predictions (CSV) here")
    p.set_defaults(func=run)


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an --out / --errors path whose directory is missing or not writable before any fitting (minutes)."""
    for flag, path in (("--out", args.out), ("--errors", args.errors)):
        if path is None:
            continue
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(f"cannot write it: no directory {str(parent)!r}", file=str(path), field=flag)
        if not os.access(parent, os.W_OK) or path.is_dir():
            raise InputError("cannot write it: not a writable file path", file=str(path), field=flag)


def run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    if args.public:
        if args.tables:
            raise InputError("--public reads the public data file (--data), not tables", field="tables")
        return run_public(args)
    if not args.tables or not args.gpu:
        raise InputError("give the measured tables and --gpu (or --public)", field="tables")
    return run_tables(args)


def run_tables(args: argparse.Namespace) -> int:
    from phantora.perfmodel.evaluate import class_errors, format_errors, predict_rows, write_predictions
    from phantora.perfmodel.fit import fit_curves, split_rows
    from phantora.perfmodel.gpus import get_gpu
    from phantora.perfmodel.model import save_curves
    from phantora.perfmodel.table import read_table
    from phantora.rank_options import DEFAULT_LAUNCH_NS

    gpu = get_gpu(args.gpu)
    rows = [r for path in args.tables for r in read_table(path)]
    train_idx, test_idx = split_rows(rows, args.holdout, args.seed)
    train = [rows[i] for i in train_idx]
    test = [rows[i] for i in test_idx]
    names = ", ".join(p.name for p in args.tables)
    print(f"{len(rows)} rows from {names}; gpu {gpu.name}; holdout {args.holdout} seed {args.seed}: "
          f"{len(train)} train, {len(test)} test")  # fmt: skip
    start = time.perf_counter()
    curves = fit_curves(train, gpu)
    print(f"fitted on {curves.meta['rows']} timed training rows in {time.perf_counter() - start:.1f} s "
          f"(loss {curves.meta['loss']:.4f})")  # fmt: skip
    curves.meta.update(holdout=args.holdout, seed=args.seed, tables=[p.name for p in args.tables])
    if test:
        preds = predict_rows(test, gpu, curves)
        errors = class_errors(preds)
        baseline = class_errors(predict_rows(test, gpu, None))
        launch = class_errors(predict_rows(test, gpu, None, launch_ns=DEFAULT_LAUNCH_NS))
        print("held-out relative error |predicted - measured| / measured of the fitted kernel-time model;")
        print("roofline: max(FLOPs / peak, bytes / DRAM bandwidth), efficiency 1, no floor; roofline+1us: the same")
        print("plus the 1 us launch overhead, as `phantora run --compute-model roofline` charges it:")
        print(format_errors(errors, baseline, ("roofline+1us", launch)))
        curves.meta["test_errors"] = {e.op_class: {"rows": e.count, "median": e.median, "p90": e.p90} for e in errors}
        if args.errors:
            write_predictions(args.errors, preds)
            print(f"wrote {args.errors}")
    else:
        print("no held-out rows (holdout 0): nothing to report")
    if args.out:
        save_curves(args.out, curves)
        print(f"wrote {args.out}")
    return 0


def run_public(args: argparse.Namespace) -> int:
    from phantora.perfmodel import pubfit
    from phantora.perfmodel.gpus import get_gpu
    from phantora.perfmodel.model import load_curves
    from phantora.perfmodel.public import read_points

    base = load_curves()
    points = read_points(args.data)
    if args.gpu:
        chip = get_gpu(args.gpu).chip
        points = [p for p in points if p.gpu.chip == chip]
        if not points:
            raise InputError(f"no public rows for {args.gpu}'s die ({chip})", field="gpu")
    source = args.data or "the shipped public_kernels.csv"
    print(f"{len(points)} public rows from {source}; base curves: default_curves.json (perfdb/l40s)")
    fits: dict[str, pubfit.DieFit] = {}
    held: list[pubfit.Held] = []
    for chip, pts in pubfit.by_fit(points).items():  # a die, then its FlashAttention-3 fit over the die's
        t0 = time.perf_counter()
        start = pubfit.base_for(chip, base, fits)
        fits[chip] = pubfit.fit_die(pts, start, name=chip)
        t1 = time.perf_counter()
        held += pubfit.leave_one_out(pts, start)
        t2 = time.perf_counter()
        knobs = ", ".join(f"{g}.{k}={v:.3g}" for g, vals in fits[chip].params.items() for k, v in vals.items())
        print(f"{chip} ({', '.join(fits[chip].gpus)}): {len(pts)} rows; fit {t1 - t0:.1f} s, leave-one-out "
              f"{t2 - t1:.1f} s; {knobs}")  # fmt: skip
    print(pubfit.format_held(held, pubfit.baseline(points, base)))
    if args.errors:
        pubfit.write_held(args.errors, held)
        print(f"wrote {args.errors}")
    if args.out:
        pubfit.save(args.out, fits, pubfit.data_digest(args.data))
        print(f"wrote {args.out}")
    return 0
