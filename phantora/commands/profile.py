"""`phantora profile --out table.csv`: record a measured op table on this machine's CUDA GPU.

Times a built-in sweep of ops (GEMMs, flash attention, elementwise, reductions, copies, fills,
foreach, host copies) with CUDA events and writes phantora's table format, ready for
`phantora calibrate` or as a measured table that takes priority over the model."""

from __future__ import annotations

import argparse
from pathlib import Path

from phantora.perfmodel.ops import CLASSES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="record a measured op table on a CUDA GPU", description=__doc__)
    p.add_argument("--out", "-o", type=Path, required=True, help="table to write (CSV)")
    p.add_argument("--only", default=None, help=f"comma-separated op classes to measure ({', '.join(CLASSES[:-1])})")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per op (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per op (default 10)")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="do not replay calls as a CUDA graph")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from phantora.errors import InputError
    from phantora.perfmodel.profiling import default_specs, profile, require_cuda
    from phantora.perfmodel.table import write_table

    specs = default_specs()
    if args.only:
        wanted = {c.strip() for c in args.only.split(",") if c.strip()}
        unknown = wanted - set(CLASSES)
        if unknown:
            raise InputError(f"unknown op class {', '.join(sorted(unknown))} (known: {', '.join(CLASSES)})",
                             field="only")  # fmt: skip
        specs = [s for s in specs if s.op_class in wanted]
    if args.iters < 1 or args.warmup < 0:
        raise InputError("--iters must be >= 1 and --warmup >= 0", field="iters")
    torch = require_cuda()
    rows = list(tqdm(profile(specs, warmup=args.warmup, iters=args.iters, graphs=args.graphs, device=args.device),
                     total=len(specs), desc="profile", unit="op"))  # fmt: skip
    device = torch.cuda.get_device_name()
    comment = f"measured on {device} with torch {torch.__version__}, CUDA {torch.version.cuda}, by phantora profile"
    write_table(args.out, rows, comment=comment)
    print(f"measured {len(rows)} ops on {device}; wrote {args.out}")
    return 0
