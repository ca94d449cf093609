"""The A100 LL and LL128 kernels' achieved rates (phantora/collectives/nccl/proto_rate.py): fitted on one table.

    .venv/bin/python bench/bench_proto_rate.py          # the fit on Azure's table, every A100 table without and
                                                         # with the fitted rates size by size, the marginal rates
    .venv/bin/python bench/bench_proto_rate.py --fit    # the fit only

The fit: for LL128, then LL, the one bus bandwidth (GB/s, on a 1 GB/s grid) that minimises the squared relative
busbw errors of the sizes the fitting table ran with the protocol (NCCL's own choice, which the rates do not
change), each size simulated as bench_nccl_tests.py does. Only the fitting table is looked at; the others are held
out. The marginal rates are a check that needs no model: between consecutive published sizes S1 < S2 that NCCL
runs with one protocol, (S2 - S1) x 2(n-1)/n over the time they add, the rate with every fixed cost cancelled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nccl_tests import simulate

from phantora.collectives.nccl import proto_rate, tuning
from phantora.collectives.nccl.published import Table, tables

FIT_TABLE = "a100_8gpu_1node_all_reduce_azure_nda100v4"  # NCCL 2.18.5, the one A100 mid-size table of known NCCL
PROTOCOLS = ("LL128", "LL")  # fitted one after the other: no size runs both
MIN_SIZE = 1 << 20  # bench_nccl_tests.py compares from 1 MiB
GRID = range(20, 221)  # GB/s busbw: up to NCCL's own LL128 rating on an 8-GPU A100 (220.8)


def _set(rates: dict[str, float]) -> None:
    """Run the model with A100 `rates` by protocol (none: NCCL's ratings), its caches cleared."""
    proto_rate.ACHIEVED_BUSBW.clear()
    proto_rate.ACHIEVED_BUSBW.update({("ampere", proto): r for proto, r in rates.items()})
    tuning.select.cache_clear()


def errors(table: Table, rates: dict[str, float]) -> list[tuple[int, float, float, str]]:
    """(size, published, simulated, algorithm/protocol) of every compared size of `table` under `rates`."""
    _set(rates)
    out = []
    for size, published in table.rows:
        if size < MIN_SIZE or published <= 0:
            continue
        bus, choice = simulate(table, size)
        out.append((size, published, bus, f"{choice.get('algorithm')}/{choice.get('protocol')}"))
    return out


def fit(table: Table, proto: str, others: dict[str, float]) -> tuple[float, list[int]]:
    """The grid rate of least squared relative error on `table`'s sizes that ran `proto` (the other protocols'
    rates `others`), and those sizes."""
    sizes = [s for s, _, _, what in errors(table, others) if what.endswith("/" + proto)]
    published = dict(table.rows)
    best: tuple[float, float] | None = None
    for rate in GRID:
        _set(others | {proto: float(rate)})
        sse = sum(((simulate(table, s)[0] - published[s]) / published[s]) ** 2 for s in sizes)
        if best is None or sse < best[0]:
            best = (sse, float(rate))
    assert best is not None
    return best[1], sizes


def marginal_rates(table: Table, choices: dict[int, str]) -> list[str]:
    """`table`'s busbw between consecutive published sizes of one protocol (all-reduce: 2(n-1)/n), as text."""
    factor = 2 * (table.gpus - 1) / table.gpus
    times = {s: s * factor / (b * 1e3) for s, b in table.rows if b > 0 and s in choices}  # µs
    sizes = sorted(times)
    out = []
    for s1, s2 in zip(sizes, sizes[1:], strict=False):
        if choices[s1] == choices[s2] and choices[s1].split("/")[1] in PROTOCOLS and times[s2] > times[s1]:
            rate = (s2 - s1) * factor / ((times[s2] - times[s1]) * 1e3)
            out.append(f"{s1 >> 20}-{s2 >> 20} MiB {choices[s1].split('/')[1]} {rate:.0f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="print the fit only")
    args = ap.parse_args()
    shipped = {proto: r for (arch, proto), r in proto_rate.ACHIEVED_BUSBW.items() if arch == "ampere"}
    by_name = {t.name: t for t in tables()}
    rates: dict[str, float] = {}
    for proto in PROTOCOLS:
        rate, sizes = fit(by_name[FIT_TABLE], proto, rates)
        rates[proto] = rate
        print(
            f"fit on {FIT_TABLE}: ampere {proto} {rate:.0f} GB/s busbw over {len(sizes)} size(s) "
            f"({', '.join(f'{s >> 20} MiB' for s in sizes)}); proto_rate.py has {shipped.get(proto)}"
        )
    if args.fit:
        _set(shipped)
        return
    for name, table in sorted(by_name.items()):
        if table.gpu != "a100":
            continue
        before, after = errors(table, {}), errors(table, rates)
        role = "fitted" if name == FIT_TABLE else "held out"
        print(f"\n{name} ({role})\n{'size':>10} {'published':>10} {'NCCL rating':>12} {'fitted rates':>12}  choice")
        for (size, pub, b, what), (_, _, a, _) in zip(before, after, strict=True):
            print(f"{size >> 20:>8}M {pub:>10.2f} {(b - pub) / pub:>+11.1%} {(a - pub) / pub:>+11.1%}  {what}")
    print("\nmarginal busbw (GB/s) of the one-host A100 all-reduce tables, published sizes only:")
    for name, table in sorted(by_name.items()):
        if table.gpu == "a100" and table.nodes == 1 and table.kind == "all_reduce":
            choices = {s: what for s, _, _, what in errors(table, rates)}
            print(f"  {name}: {', '.join(marginal_rates(table, choices)) or 'none'}")
    _set(shipped)


if __name__ == "__main__":
    main()
