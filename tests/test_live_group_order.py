"""A process group created after another group's collective, as programs do (torch's new_group is called by every
rank, members or not): ranks outside the first group reach the second group's creation while the first group's
members wait in its simulated all-reduce. Before, the real-data gloo group of the second group rendezvoused at
creation, so those ranks blocked there, their clocks never advanced, and the first all-reduce never finished: the
run hung until its timeout (found by bench/bench_nccl_live_sweep.py). NCCL creates communicators at first use."""

from __future__ import annotations

import textwrap
from pathlib import Path

from phantora.errors import PhantoraError
from phantora.launcher import RunConfig, launch
from phantora.topology.generators import leaf_spine

# The bound of a 3-rank run, its start-up included. The co-simulation itself takes about 1 s; the start-up (the fork
# server importing torch, the coordinator, three ranks) took 9-25 s of 11-33 s runs at load 14-17 on the shared
# 2-core machine (2026-12-02), and tests/test_gloo_lanes.py's slow test took 94 s once, with a 60 s bound, at load
# 11-20: a bound near a minute meets a slow start-up, not a hang. A run that hangs still fails, its logs kept.
STAR3_TIMEOUT_S = 180.0


def star3_results(tmp_path: Path, name: str, text: str, timeout_s: float = STAR3_TIMEOUT_S) -> list[list[str]]:
    """Run `text` live on 3 ranks of a one-switch fabric; each rank's "RESULT ..." lines' fields, sorted. The logs
    are joined a line apart, so a rank log that ends without a newline keeps its last line apart. The run's
    directory (its logs/) is kept under `tmp_path`; a run that fails says so with each rank's last lines."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    out = tmp_path / f"{script.stem}-run"
    star3 = leaf_spine(1, 3, 0, name="star3")
    try:
        rep = launch(RunConfig(str(script), topology=star3, nproc=3, trace="none", timeout_s=timeout_s, out_dir=out))
    except PhantoraError as exc:
        rank_logs = sorted((out / "logs").glob("rank*.log"))
        where = "\n".join(f"{log.name}: {stood(log.read_text(), script.name)}" for log in rank_logs)
        raise AssertionError(f"{exc}\n(the run's logs: {out / 'logs'})\n{where}") from exc
    logs = "\n".join(rep.logs[f"rank {r}"] for r in range(3))
    return sorted(line.split()[1:] for line in logs.splitlines() if line.startswith("RESULT"))


def stood(log: str, script: str) -> str:
    """Where a rank's program stood when the supervisor stopped it: the stack phantora/runtime/stop_stacks.py wrote of
    the thread running `script` (the one that took the signal if none), else the log's last lines."""
    threads = [block for block in log.split("\n\n") if "(most recent call first)" in block]
    if not threads:
        return repr(log[-400:])
    mine = [t for t in threads if f'{script}", line' in t] or [t for t in threads if "Current thread" in t] or threads
    return "\n" + "\n".join(mine[0].splitlines()[:14])


SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    x = torch.ones(4)
    if rank in (0, 1):
        dist.all_reduce(x, group=pair)
    world = dist.new_group([0, 1, 2])
    y = torch.ones(4)
    dist.all_reduce(y, group=world)
    print("RESULT", rank, float(x[0]), float(y[0]), flush=True)
    dist.destroy_process_group()
"""


def test_a_group_created_after_another_groups_collective_runs(tmp_path) -> None:
    got = star3_results(tmp_path, "order.py", SCRIPT)
    # the pair's sum is 2 on its members, 1 (untouched) on rank 2; the world's sum is 3 everywhere
    assert got == [["0", "2.0", "3.0"], ["1", "2.0", "3.0"], ["2", "1.0", "3.0"]]


LATE_PAIR = """
    import time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    pair = dist.new_group([1, 2])
    if rank in (1, 2):
        time.sleep(2)  # rank 0, which serves the rendezvous store, has destroyed its groups and finished by now
        x = torch.ones(4)
        dist.all_reduce(x, group=pair)
        print("RESULT", rank, float(x[0]), flush=True)
    dist.destroy_process_group()
"""


def test_a_pair_first_exchanging_after_rank_0_finished_connects(tmp_path) -> None:
    """gloo's pairs connect at their first exchange through the store rank 0 serves (gloo_store.py): rank 0 keeps
    serving it until every rank has ended. Without that, lazy connection failed here ("Connection was likely
    closed"), as a pipeline's last stages exchanging after the first stage's rank 0 ended would."""
    got = star3_results(tmp_path, "late.py", LATE_PAIR)
    assert got == [["1", "2.0"], ["2", "2.0"]]  # the pair's sum of ones


SPLIT_AFTER_PAIR = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    x = torch.ones(4)
    if rank in (0, 1):
        dist.all_reduce(x, group=pair)
    block = dist.split_group(split_ranks=[[0, 1, 2]])
    y = torch.ones(4)
    dist.all_reduce(y, group=block)
    print("RESULT", rank, float(x[0]), float(y[0]), flush=True)
    dist.destroy_process_group()
"""


def test_split_group_after_a_pairs_group_connects(tmp_path) -> None:
    """torch names a split group by a hash of its ranks and the number of groups this rank has made, so after
    new_group([0, 1]) ranks 0-1 and rank 2 name the same split differently (rank 2 keeps no handle of the pair).
    ncclCommSplit runs over the parent communicator, names aside; the split's real-data gloo group rendezvoused
    under that name and hung (found by bench/bench_nccl_live_sweep.py). It now meets under the parent's split
    count and the members' global ranks."""
    got = star3_results(tmp_path, "split.py", SPLIT_AFTER_PAIR)
    # the pair's sum is 2 on its members, 1 on rank 2; the split block's (all three) sum is 3 everywhere
    assert got == [["0", "2.0", "3.0"], ["1", "2.0", "3.0"], ["2", "1.0", "3.0"]]
