"""flows.csv lists every flow that carried bytes between two endpoints; the zero-byte timing points a collective
plans (credits inside a host: the flag a receiver stores across NVLink, at the sender) are counted beside it, in
results.json (nccl-tests) and cosim.json (a live run) `flows_csv`, so its rows plus those are every planned flow.

Checked against a chunked LL ring all-gather's closed form on 2 hosts of 8 GPUs (n = 16 ranks, one channel, nccl-tests'
64 KiB: 4 KiB a rank): every one of the 16 ring connections carries n - 1 = 15 steps of 2 x 4 KiB (LL: 8-byte lines of
4 data bytes and a 4-byte flag); each of the 2 connections between hosts gets a 64 B clear-to-send a step (its
receiver's posted receive); each of the 14 inside a host a credit for each step past NCCL_STEPS = 8 in flight (the
first 8 find a free slot), 14 x 7 = 98, zero-byte flows at the sender, not written.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from forked_replay import replay_ranks

from bridge.run import CosimRun
from phantora.cli import main
from phantora.collectives.spec import AlgoOptions
from phantora.results import schema as S
from phantora.topology.generators import rail_optimized

ROOT = Path(__file__).resolve().parents[1]

HOSTS, PER_HOST = 2, 8
N = HOSTS * PER_HOST
SIZE = 64 << 10  # the gathered buffer
STEPS = N - 1  # a ring all-gather's steps on each connection
NCCL_STEPS = 8  # slots of a connection (NCCL's NCCL_STEPS): steps in flight before a credit is awaited
LL_WIRE = 2
ENV = (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL"))
DATA = {str(LL_WIRE * SIZE // N): N * STEPS}  # size_bytes -> flows of data
CTS = {"64": HOSTS * STEPS}  # a clear-to-send a step on each connection between hosts
CREDITS = (N - HOSTS) * (STEPS - NCCL_STEPS)  # inside a host: a credit a step past the window


def _topology(tmp_path: Path) -> Path:
    path = tmp_path / "r2x8.toml"
    path.write_text(
        f'[generator]\nkind = "rail_optimized"\nhosts = {HOSTS}\ngpus_per_host = {PER_HOST}\nspines = 2\n'
        'nic_rate = "400Gbps"\n'
    )
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _by_kind(rows: list[dict[str, str]]) -> dict[str, Counter[str]]:
    """Rows by the last part of their tag (digits dropped) and size."""
    out: dict[str, Counter[str]] = {}
    for r in rows:
        out.setdefault(r["tag"].rsplit("/", 1)[-1].rstrip("0123456789"), Counter())[r["size_bytes"]] += 1
    return out


def _check(rows: list[dict[str, str]], count: dict[str, object]) -> None:
    assert _by_kind(rows) == {"step": Counter(DATA), "credit": Counter(CTS)}
    assert all(r["src"] != r["dst"] and int(r["size_bytes"]) > 0 for r in rows)
    assert count == {"rows": len(rows), "not_written": {"at_one_endpoint": {"credit": CREDITS}}}


def test_nccl_tests_flows_csv_is_the_planned_flows_less_the_counted_credits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in ENV:
        monkeypatch.setenv(k, v)
    out = tmp_path / "ag"
    argv = ["nccl-tests", "all_gather_perf", "-b", str(SIZE), "-e", str(SIZE), "-n", "1", "-w", "0"]
    assert main([*argv, "--granularity", "chunked", "--topology", str(_topology(tmp_path)), "--out", str(out)]) == 0
    data = json.loads((out / S.RESULTS_JSON).read_text())
    choice = data["sizes"][0]["choice"]
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "LL", 1)
    assert data["nccl_env"] == dict(ENV)  # the variables that forced it, recorded
    _check(_rows(out / S.FLOWS_CSV), data["flows_csv"])


def test_a_live_runs_flows_csv_with_its_counted_credits_is_every_planned_flow(tmp_path: Path) -> None:
    wl = tmp_path / "ag.toml"
    wl.write_text(
        'name = "ag"\n[defaults]\nranks = "all"\ndtype = "fp32"\n'
        f'[[op]]\nname = "ag"\nkind = "all_gather"\nbytes = {SIZE}\nat = "0us"\n'
    )
    topo = rail_optimized(HOSTS, PER_HOST, 2, nic_rate="400Gbps")
    algo = AlgoOptions(granularity="chunked", nccl_env=ENV)
    out = tmp_path / "live"
    res = CosimRun(topo, **replay_ranks(wl), algo=algo, out_dir=out, timeout_s=120).run()
    cosim = json.loads((out / S.COSIM_JSON).read_text())
    ((coll),) = cosim["collectives"]
    assert (coll["nccl"]["algorithm"], coll["nccl"]["protocol"], coll["nccl"]["channels"]) == ("Ring", "LL", 1)
    assert coll["flows"] == N * STEPS + HOSTS * STEPS + CREDITS == len(res.completions)
    _check(_rows(out / S.FLOWS_CSV), cosim["flows_csv"])


STEP = (4 << 20) // NCCL_STEPS  # a Simple step: NCCL_BUFFSIZE's default over NCCL_STEPS
ALLREDUCE_CHUNKSTEPS = 4  # a ring all-reduce's Simple chunk is 4 steps, so 2 of its chunks fill the 8 slots
ALLREDUCE_SLICESTEPS = 2  # moved as 2 slices of 2 slots each, each its own message: 4 in flight
SLICE_FLOOR = STEP * ALLREDUCE_SLICESTEPS // 32  # genericOp's least slice (prims_simple.h): 32 KiB


def _credits(kind: str, nbytes: int, n: int) -> int:
    """Credits inside a host of one chunked Simple ring call on one channel of n = 2 GPUs: a broadcast's chain sends
    its S in steps of one slot, a credit each past the 8th; an all-reduce sends each rank's half in chunks of 4 slots,
    2(n - 1) steps of each on each of its 2 connections, each chunk as 2 slices (a chunk over twice the least
    slice, as this call's are) of 2 slots, a credit each slice past the 4th."""
    assert n == 2
    if kind == "broadcast":
        return max(0, -(-nbytes // STEP) - NCCL_STEPS)
    if kind == "all_reduce":
        chunks = -(-(nbytes // n) // (ALLREDUCE_CHUNKSTEPS * STEP))
        assert nbytes // n // chunks > 2 * SLICE_FLOOR, nbytes  # the premise: 2 slices of data a chunk
        slices = ALLREDUCE_CHUNKSTEPS // ALLREDUCE_SLICESTEPS
        return n * max(0, 2 * (n - 1) * chunks * slices - NCCL_STEPS // ALLREDUCE_SLICESTEPS)
    assert kind == "all_gather" and nbytes <= STEP, (kind, nbytes)  # a message per rank: fits the slots
    return 0


def test_phantora_run_results_count_the_credits_flows_csv_leaves_out(tmp_path: Path) -> None:
    """`phantora run` (2 GPUs of one host, chunked, Ring Simple on one channel): results.json's `network.flows_csv`
    and cosim.json's count flows.csv's rows and, by the closed form above, the credits left out; with them they are
    every flow the engine was given."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "dgx8", "--nproc", "2", "--phantom"]
    cmd += ["--granularity", "chunked", "--out", str(out), "-q", str(ROOT / "examples" / "gpt_ddp.py")]
    cmd += ["--steps", "1", "--layers", "2", "--d-model", "256"]
    env = {**os.environ, "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    cosim = json.loads((out / S.COSIM_JSON).read_text())
    network = json.loads((out / S.RESULTS_JSON).read_text())["network"]
    credits = sum(_credits(c["kind"], c["nbytes"], len(c["group"])) for c in cosim["collectives"])
    assert credits > 0  # the premise: the big broadcast and all-reduce outrun their slots
    rows = _rows(out / S.FLOWS_CSV)
    count = {"rows": len(rows), "not_written": {"at_one_endpoint": {"credit": credits}}}
    assert network["flows_csv"] == cosim["flows_csv"] == count
    planned = sum(c["flows"] for c in cosim["collectives"])
    assert planned == len(rows) + credits == network["engine_stats"]["flows_submitted"]


def test_a_replays_results_count_the_credits_flows_csv_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`phantora replay` of the same all-gather: results.json `flows_csv` by the same closed form."""
    for k, v in ENV:
        monkeypatch.setenv(k, v)
    wl = tmp_path / "ag.toml"
    wl.write_text(
        'name = "ag"\n[defaults]\nranks = "all"\ndtype = "fp32"\n'
        f'[[op]]\nname = "ag"\nkind = "all_gather"\nbytes = {SIZE}\nat = "0us"\n'
    )
    out = tmp_path / "replay"
    argv = ["replay", str(wl), "--topology", str(_topology(tmp_path)), "--granularity", "chunked", "--out", str(out)]
    assert main(argv) == 0
    _check(_rows(out / S.FLOWS_CSV), json.loads((out / S.RESULTS_JSON).read_text())["flows_csv"])
