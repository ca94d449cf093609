"""DCQCN and HPCC on testbed16's overloaded spine link: a 256 MiB chunked Simple ring all-reduce through ns-3, per
CC and with DCQCN's or HPCC's parameters changed one at a time.

ECMP puts 6 of the ring's 32 network connections on one 800G spine link of testbed16 (docs/collectives.md, "A
chunked Simple ring under coarse on testbed16"), so the call ends once that link has carried their bytes: with
PFC alone (`--cc none`) it is busy from the first slice to the last. Each row runs

    NCCL_ALGO=Ring NCCL_PROTO=Simple phantora nccl-tests all_reduce_perf -b 256M -e 256M --topology testbed16 \\
        --granularity chunked -n 1 -w 0 --network ns3 --set queue_sample_ns=1000 ARGS

with the row's ARGS, and prints the call's time (µs, nccl-tests' column), its excess over the PFC-only run, the
CNPs, and for the busiest spine link (by bytes; the upstream end, where its queue builds): its utilisation over the
run (links.csv), its deepest queue (KB) and the share of each 250 µs (from the first flow's start) in which its
queue held a packet at the 1 µs samples (queues.csv): under that share the link ran underfed.

The `hpcc.ATTR` rows change one HPCC attribute at a time (`hpcc+int_header_bytes=0`: no INT space in the
packets); `--hpcc` runs `none` and the `hpcc` rows only. `--conns` adds a line under each row for the 32 network
connections (a GPU's flows to the other host, one channel): the slowest one's payload rate over [500, 1500) µs
from the first flow's start (each flow's bytes spread evenly from its start to its end), the median, the last end
and the last of the other channels' (µs from the first flow's start). `--granularity coarse` runs the coarse call
instead.

    .venv/bin/python bench/bench_dcqcn_spine.py [--only NAME,NAME | --hpcc] [--conns] [--granularity chunked|coarse]

Simulated figures, deterministic; about 30 s of CPU a row.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

BIN_NS = 250_000
GPUS_PER_HOST = 8  # testbed16
WINDOW_NS = (500_000, 1_500_000)  # `--conns`: the connections' rates over this span from the first flow's start
DCQCN = ["--cc", "dcqcn"]
# NVIDIA ConnectX NVConfig defaults (mlxconfig): RPG_BYTE_RESET 32767 B, RPG_AI_RATE 5 / RPG_HAI_RATE 50 Mb/s,
# DCE_TCP_G 1019 (alpha keeps 1019/1024: g = 5/1024), RPG_MIN_RATE 1 Mb/s, MIN_TIME_BETWEEN_CNPS 4 us.
CX = {
    "ByteCounter": "32767",
    "RateAi": "5000000",
    "RateHai": "50000000",
    "G": str(5 / 1024),
    "MinRate": "1000000",
    "CnpInterval": "4us",
}


def _cc(**attrs: str) -> list[str]:
    """DCQCN with these attributes set (`--set cc.NAME=VALUE`)."""
    out = list(DCQCN)
    for name, value in attrs.items():
        out += ["--set", f"cc.{name}={value}"]
    return out


def _hpcc(**attrs: str) -> list[str]:
    """HPCC with these attributes set."""
    out = ["--cc", "hpcc"]
    for name, value in attrs.items():
        out += ["--set", f"cc.{name}={value}"]
    return out


VARIANTS: list[tuple[str, list[str]]] = [
    ("none", ["--cc", "none"]),
    ("dctcp", ["--cc", "dctcp"]),
    ("hpcc", ["--cc", "hpcc"]),
    ("dcqcn", DCQCN),
    ("RpTimer=55us", _cc(RpTimer="55us")),
    ("FastRecoveryTimes=5", _cc(FastRecoveryTimes="5")),
    ("RateAi/Hai=5/50M", _cc(RateAi=CX["RateAi"], RateHai=CX["RateHai"])),
    ("G=5/1024", _cc(G=CX["G"])),
    ("MinRate=1M", _cc(MinRate=CX["MinRate"])),
    (
        "kmin/kmax=400K/1.6M",
        [
            *DCQCN,
            "--set",
            "kmin_map=400000000000 400000 800000000000 400000",
            "--set",
            "kmax_map=400000000000 1600000 800000000000 1600000",
        ],
    ),
    ("pmax=1", [*DCQCN, "--set", "pmax_map=400000000000 1.0 800000000000 1.0"]),
    ("CnpInterval=4us", _cc(CnpInterval=CX["CnpInterval"])),
    ("ByteCounter=10M", _cc(ByteCounter="10000000")),
    ("ByteCounter=32767", _cc(ByteCounter=CX["ByteCounter"])),
    ("ByteCounter+CnpInterval", _cc(ByteCounter=CX["ByteCounter"], CnpInterval=CX["CnpInterval"])),
    ("ConnectX", _cc(**CX)),
    ("hpcc.TargetUtil=1.0", _hpcc(TargetUtil="1.0")),
    ("hpcc.MiThresh=5", _hpcc(MiThresh="5")),
    ("hpcc.RateAi=1.6G", _hpcc(RateAi="1600000000")),
    ("hpcc.RateAi=16G", _hpcc(RateAi="16000000000")),
    ("hpcc.FastReact=false", _hpcc(FastReact="false")),
    ("hpcc.VarWin=false", _hpcc(VarWin="false")),
    ("hpcc.SampleFeedback=1", _hpcc(SampleFeedback="true")),
    ("hpcc+int_header_bytes=0", ["--cc", "hpcc", "--set", "int_header_bytes=0"]),
]


def run(args: list[str], out: Path, granularity: str = "chunked") -> None:
    """One nccl-tests call into `out`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_ALGO="Ring", NCCL_PROTO="Simple")
    cmd = [
        sys.executable,
        "-m",
        "phantora.cli",
        "nccl-tests",
        "all_reduce_perf",
        "-b",
        "256M",
        "-e",
        "256M",
        "--topology",
        "testbed16",
        "--granularity",
        granularity,
        "-n",
        "1",
        "-w",
        "0",
        "--network",
        "ns3",
        "--set",
        "queue_sample_ns=1000",
        "--out",
        str(out),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")


def row(name: str, out: Path, base_us: float | None) -> tuple[str, float]:
    """The table row of one run's files."""
    res = json.loads((out / "results.json").read_text())
    time_us = float(res["sizes"][0]["time_us"])
    with open(out / "links.csv", newline="") as f:
        spine = [r for r in csv.DictReader(f) if r["from"].startswith("leaf") and r["to"].startswith("spine")]
    hot = max(spine, key=lambda r: (int(r["bytes"]), int(r["max_queue_bytes"])))
    with open(out / "flows.csv", newline="") as f:
        first = min(int(r["start_ns"]) for r in csv.DictReader(f))
    busy: dict[int, int] = {}
    with open(out / "queues.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["node"] == hot["from"] and r["peer"] == hot["to"] and int(r["bytes"]) > 0:
                k = (int(r["time_ns"]) - first) // BIN_NS
                busy[k] = busy.get(k, 0) + 1
    span = int(time_us * 1000) // BIN_NS + 1
    shares = " ".join(f"{min(100, round(100 * busy.get(k, 0) * 1000 / BIN_NS)):3d}" for k in range(span))
    over = "" if base_us is None else f"{100 * (time_us / base_us - 1):+.1f}%"
    line = (
        f"{name:<24} {time_us:9.2f} {over:>7} {res['engine']['cnps']:7d} {float(hot['utilisation']):6.3f} "
        f"{int(hot['max_queue_bytes']) / 1000:8.1f}  {shares}"
    )
    return line, time_us


def conns(out: Path) -> str:
    """The `--conns` line of one run: its network connections' rates over [500, 1500) µs and their last ends."""
    with open(out / "flows.csv", newline="") as f:
        flows = list(csv.DictReader(f))
    first = min(int(r["start_ns"]) for r in flows)
    done: dict[str, float] = {}
    end: dict[str, int] = {}
    for r in flows:
        src, dst = int(r["src_id"]), int(r["dst_id"])
        if src // GPUS_PER_HOST == dst // GPUS_PER_HOST:
            continue
        ch = next((p for p in r["tag"].split("/") if p.startswith("ch")), "?")
        key = f"{src}->{dst}/{ch}"
        b, e = int(r["start_ns"]) - first, int(r["end_ns"]) - first
        end[key] = max(end.get(key, 0), e)
        # its bytes spread evenly over its lifetime, the part inside the window counted
        inside = max(0, min(e, WINDOW_NS[1]) - max(b, WINDOW_NS[0]))
        done[key] = done.get(key, 0.0) + (int(r["size_bytes"]) * inside / (e - b) if e > b else 0.0)
    rate = {k: b * 8 / (WINDOW_NS[1] - WINDOW_NS[0]) for k, b in done.items()}
    slow = min(rate, key=lambda k: (rate[k], k))
    ordered = sorted(rate.values())
    median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    last = max(end, key=lambda k: (end[k], k))
    channel = last.split("/")[1]
    other = max((k for k in end if k.split("/")[1] != channel), key=lambda k: (end[k], k))
    return (
        f"    {len(rate)} conns: slowest {slow} {rate[slow]:.1f} Gb/s, median {median:.1f}; last end {last} "
        f"{end[last] / 1000:.2f} us, other channels' {other} {end[other] / 1000:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated row names (default: all; 'none' always runs first)")
    ap.add_argument("--hpcc", action="store_true", help="the none row and the hpcc rows only")
    ap.add_argument("--conns", action="store_true", help="a line of the network connections' rates under each row")
    ap.add_argument("--granularity", choices=("chunked", "coarse"), default="chunked")
    ns = ap.parse_args()
    names = {n for n in ns.only.split(",") if n}
    if ns.hpcc:
        names |= {n for n, _ in VARIANTS if n.startswith("hpcc")}
    unknown = names - {n for n, _ in VARIANTS}
    if unknown:
        raise SystemExit(f"--only: no row named {', '.join(sorted(unknown))}")
    print(
        f"{'row':<24} {'time us':>9} {'vs none':>7} {'cnps':>7} {'util':>6} {'maxq KB':>8}  "
        f"queue-held % of each {BIN_NS // 1000} us"
    )
    base: float | None = None
    for name, args in VARIANTS:
        if names and name not in names and name != "none":
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run(args, Path(tmp) / "out", ns.granularity)
            line, t = row(name, Path(tmp) / "out", base)
            extra = conns(Path(tmp) / "out") if ns.conns else ""
        base = t if base is None else base
        print(line, flush=True)
        if extra:
            print(extra, flush=True)


if __name__ == "__main__":
    main()
