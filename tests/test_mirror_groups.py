"""Rank deduplication refuses a collective on a new_group or split_group group whose shifted copy the program never
made (the mirrored ranks would not run it; phantora/runtime/mirror_groups.py), and lets through programs that make
every copy."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.runtime import mirror_groups


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    mirror_groups.reset()
    yield
    mirror_groups.reset()


def test_a_group_without_its_shifted_copy_is_refused() -> None:
    """16 ranks, 8 live: [0..3] stands for [8..11] too, which the program never made."""
    mirror_groups.note([0, 1, 2, 3])
    with pytest.raises(InputError, match=r"--dedup.*copy \[8, 9, 10, 11\].*--dedup off"):
        mirror_groups.check((0, 1, 2, 3), 16, 8, "all_reduce")


def test_a_group_made_on_every_host_passes() -> None:
    for h in range(2):
        mirror_groups.note(range(8 * h, 8 * h + 4))
    mirror_groups.check((0, 1, 2, 3), 16, 8, "all_reduce")
    mirror_groups.note([0, 8])  # a DP pair: its own shift by 8 (live ranks 0 and 8 mirror each other)
    mirror_groups.check((0, 8), 16, 8, "all_reduce")


def test_a_split_without_its_shifted_copy_is_refused() -> None:
    """split_group's lists are group ranks of the parent: split [[0, 1]] of the parent [8..15] is [8, 9], whose
    copy under 8 live of 16 ranks is [0, 1]; refused, naming split_group, until the parent [0..7] makes it too."""
    mirror_groups.note_split(list(range(8, 16)), [[0, 1]])
    with pytest.raises(InputError, match=r"group \[8, 9\] \(split_group\).*copy \[0, 1\].*--dedup off"):
        mirror_groups.check((8, 9), 16, 8, "all_gather")
    mirror_groups.note_split(list(range(8)), [[1, 0], [2, 3]])
    mirror_groups.check((8, 9), 16, 8, "all_gather")
    mirror_groups.check((0, 1), 16, 8, "all_gather")
    with pytest.raises(InputError, match=r"copy \[10, 11\]"):
        mirror_groups.check((2, 3), 16, 8, "all_gather")


def test_unchecked_groups() -> None:
    """Without deduplication, groups made by no call this rank saw, and local-sync new_groups."""
    mirror_groups.note([0, 1, 2, 3])
    mirror_groups.check((0, 1, 2, 3), 16, 16, "all_reduce")  # every rank live
    mirror_groups.check((4, 5), 16, 8, "all_reduce")  # made by no call seen here
    mirror_groups.note([0, 1], local=True)
    mirror_groups.check((0, 1), 16, 8, "all_reduce")


PROGRAM = """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    groups = [dist.new_group(list(range(8 * h, 8 * h + 4))) for h in range({hosts})]
    x = torch.ones(1 << 18, device="cuda")
    if rank % 8 < 4:
        dist.all_reduce(x, group=groups[rank // 8])
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("hosts", "ok"), [(1, False), (2, True)])
def test_live_run_on_two_hosts(tmp_path: Path, hosts: int, ok: bool) -> None:
    """testbed16, 16 ranks, --phantom (8 live): a 4-rank group made on host 0 only is refused in one line naming
    --dedup; made on both hosts, the run goes through and the collective runs as two copies."""
    _run_live(tmp_path, PROGRAM.format(hosts=hosts), ok, ("field '--dedup'", "copy [8, 9, 10, 11]"))


def _run_live(tmp_path: Path, program: str, ok: bool, refusal: tuple[str, ...]) -> None:
    """Run `program` on testbed16's 16 ranks with --phantom: if `ok`, it ends with rc 0 and its one all-reduce on
    [0, 1, 2, 3] runs as two copies; else it stops with a line holding every string of `refusal`, no traceback."""
    import json
    import subprocess
    import sys

    prog = tmp_path / "p.py"
    prog.write_text(textwrap.dedent(program))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--nproc", "16", "--phantom",
           "--quiet", "--out", str(out), str(prog)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok:
        assert p.returncode == 0, p.stderr[-2000:]
        recs = json.loads((out / "cosim.json").read_text())["collectives"]
        assert [(r["group"], r["copies"]) for r in recs if r["kind"] == "all_reduce"] == [([0, 1, 2, 3], 2)]
    else:
        assert p.returncode != 0
        assert all(mark in p.stderr for mark in refusal) and "Traceback" not in p.stderr, p.stderr[-2000:]


SPLIT_PROGRAM = """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))))
    rank = dist.get_rank()
    group = dist.split_group(split_ranks=[list(range(8 * h, 8 * h + 4)) for h in range({hosts})])
    x = torch.ones(1 << 18, device="cuda")
    if group is not None:
        dist.all_reduce(x, group=group)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("hosts", "ok"), [(1, False), (2, True)])
def test_live_split_group_on_two_hosts(tmp_path: Path, hosts: int, ok: bool) -> None:
    """The same with torch's split_group (ncclCommSplit; every rank passes every split's list): split [[0..3]] on
    host 0 only is refused in one line naming split_group and --dedup (before, it ran as 2 copies, the second on
    ranks 8-11 that never call it); split on both hosts, it runs as two copies."""
    _run_live(
        tmp_path, SPLIT_PROGRAM.format(hosts=hosts), ok, ("(split_group)", "field '--dedup'", "copy [8, 9, 10, 11]")
    )
