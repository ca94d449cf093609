"""torch.distributed.checkpoint in phantom mode (phantora/runtime/phantom_dcp.py): an FSDP2 program's dcp.save and
dcp.load run unchanged, and each costs the bytes a real checkpoint holds at the storage model's rate.

The probe (tests/scripts/cuda_dcp_phantom.py): a 1024 x 1024 Linear sharded by FSDP2 over 2 ranks, Adam, a plain
1000-float tensor; each checkpoint call alone in a step. Run with `--storage 1`: the host's 1 GB/s link is shared
by its 2 ranks, which write (and read) files of the same size from the same time: 0.5 GB/s each, 2 ns a byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.results.run_dir import rank_steps

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_dcp_phantom.py"
SHARD = 512 * 1024 * 4 + 512 * 4  # a rank's half of the fp32 weight (dim 0) and of the bias, bytes
EXTRA = 1000 * 4  # the plain tensor: every rank holds it, real DCP writes it once
NS_PER_BYTE = 2  # 1 GB/s shared by 2 ranks at once


def _run(tmp: Path, ckpt: Path, tensors: str, *extra: str) -> tuple[dict[int, dict], dict[int, list[dict]]]:
    out = tmp / f"out-{tensors}"
    argv = [str(ckpt), str(tmp), *extra]
    env = {"PHANTORA_STORAGE_GBPS": "1"}  # phantora run --storage 1
    launch(RunConfig(str(SCRIPT), argv, "testbed16", nproc=2, tensors=tensors, out_dir=out, env=env, timeout_s=300))
    seen = {r: json.loads((tmp / f"seen{r}.json").read_text()) for r in (0, 1)}
    return seen, rank_steps(out)


@pytest.fixture(scope="module")
def phantom(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict], dict[int, list[dict]]]:
    tmp = tmp_path_factory.mktemp("dcp-phantom")
    ckpt = tmp / "ckpt"
    return (ckpt, *_run(tmp, ckpt, "phantom"))


def test_each_rank_writes_its_part_and_rank_0_the_global_metadata(phantom: tuple) -> None:
    """The files of a coordinated save: each rank's data, one `.metadata` (merged from the ranks' own), which
    describes both ranks' chunks of the sharded weight."""
    from torch.distributed.checkpoint import FileSystemReader

    ckpt, seen, _ = phantom
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    chunks = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata["model.weight"].chunks
    assert sorted((list(c.offsets), list(c.sizes)) for c in chunks) == [([0, 0], [512, 1024]), ([512, 0], [512, 1024])]
    for r in (0, 1):  # the shards are back on each rank's device, shapes as saved
        assert seen[r]["shards"] == {"weight": [f"cuda:{r}", [512, 1024]], "bias": [f"cuda:{r}", [512]]}
        # the optimizer's step count is a value: saved at 2 steps, loaded, one more step (it was 4 before the load)
        assert seen[r]["step"] == {"0": 3.0, "1": 3.0}
    assert all(p.stat().st_size < 8 * 1024 for p in ckpt.glob("*.distcp"))  # meta records: no tensor data


def test_a_save_and_a_load_cost_the_real_checkpoints_bytes_at_the_rate(phantom: tuple) -> None:
    """Closed forms: the save writes a rank's shard and half the plain tensor (real DCP writes it on one rank),
    the load reads the shard and the whole plain tensor; 2 ns a byte."""
    _, _, steps = phantom
    for r in (0, 1):
        io = [(s.get("storage_bytes", 0), s.get("storage_ns", 0)) for s in steps[r]]
        save, load = SHARD + EXTRA // 2, SHARD + EXTRA
        assert io[1] == (save, NS_PER_BYTE * save)
        assert io[3] == (load, NS_PER_BYTE * load)
        # the optimizer's checkpoint: the shards of the weights and of Adam's two moments, its step counts and
        # param groups (pickled objects, their length as written); saved and loaded alike
        for step in (2, 4):
            assert 3 * SHARD <= io[step][0] <= 3 * SHARD + 64 * 1024
            assert io[step][1] == NS_PER_BYTE * io[step][0]
        assert io[0] == (0, 0)


@pytest.mark.slow
def test_phantom_mode_loads_a_checkpoint_real_mode_wrote(tmp_path: Path) -> None:
    """Real mode writes a coordinated checkpoint (one `.metadata`); phantom mode loads it, each rank its part."""
    ckpt = tmp_path / "ckpt"
    _run(tmp_path, ckpt, "real")
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    seen, steps = _run(tmp_path, ckpt, "phantom", "load")
    for r in (0, 1):
        assert seen[r]["step"] == {"0": 3.0, "1": 3.0}
        load = SHARD + EXTRA
        assert (steps[r][1]["storage_bytes"], steps[r][1]["storage_ns"]) == (load, NS_PER_BYTE * load)


@pytest.mark.slow
def test_deduplicated_ranks_each_charged_their_sixteenth(tmp_path: Path) -> None:
    """16 ranks on testbed16's 2 hosts, 8 live processes (--dedup 8): each live rank writes its 1/16 shard and
    1/16 of the plain tensor, and its mirror on the other host the same, so each host's 1 GB/s link carries 8 files
    of that size, which start within a few microseconds of one another: a rank's file takes no less than alone
    (1 ns a byte) and no more than all 8 (8 ns a byte), and the 8 files of a host are all through 8 ns a byte
    after the first began, so the longest is within the ranks' start spread of it; the load likewise with its shard
    and the whole plain tensor. The merged metadata holds the live ranks' parts (mirrors have no process to write
    theirs)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    env = {"PHANTORA_STORAGE_GBPS": "1"}
    cfg = RunConfig(str(SCRIPT), [str(ckpt), str(tmp_path)], "testbed16", nproc=16, tensors="phantom", dedup=8)
    cfg.out_dir, cfg.env, cfg.timeout_s = out, env, 300
    launch(cfg)
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata"] + [f"__{r}_0.distcp" for r in range(8)]
    shard = 64 * 1024 * 4 + 64 * 4
    save, load = shard + EXTRA // 16, shard + EXTRA
    steps = rank_steps(out)
    for line, nbytes in ((1, save), (3, load)):
        got = [lines[line]["storage_ns"] for lines in steps.values()]
        assert all(lines[line]["storage_bytes"] == nbytes for lines in steps.values())
        assert all(nbytes <= ns <= 8 * nbytes + 8 for ns in got), got
        assert 8 * nbytes - 20_000 <= max(got) <= 8 * nbytes + 8, got  # the ranks start within 20 us


def _exchanges(trace: Path, rank: int) -> list[tuple[str, int]]:
    """The trace's collectives of `rank` other than FSDP2's (all-gathers and reduce-scatters of the 4 MiB weight)."""
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("pid") == rank and e.get("ph") == "X" and "#" in name and e["args"].get("bytes", 0) < 1 << 20:
            out.append((name.split("#")[0], int(e["args"]["bytes"])))
    return out


def test_the_plan_exchanges_are_charged_with_the_pickled_objects(phantom: tuple) -> None:
    """DCP's object collectives carry their values (runtime/object_values.py) and are charged torch's bytes: a
    save gathers the local plans to rank 0 and scatters them back (sizes: 8 B a rank), gathers the write results
    and broadcasts the global metadata, whose bytes are its pickle's length (closed form:
    len(pickle.dumps(the .metadata read back))); a load gathers and scatters its plans and all-gathers DCP's
    "read" step's None (2 x len(pickle.dumps(None)) = 8 B)."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    ckpt, _, _ = phantom
    trace = ckpt.parent / "out-phantom" / "trace.json"
    for rank in (0, 1):
        got = _exchanges(trace, rank)
        saves = [i for i, (kind, _) in enumerate(got) if kind == "barrier"]
        assert len(saves) == 2  # the model's and the optimizer's save (each ends with DCP's barrier)
        for end, folder in zip(saves, (ckpt, ckpt.parent / "ckpt-optim"), strict=True):
            plan = got[end - 5 : end]
            assert [k for k, _ in plan] == ["all_gather", "gather", "broadcast", "scatter", "scatter"]
            assert plan[0][1] == 2 * 8 and plan[2][1] == 8 and plan[4][1] == 2 * 8
            assert plan[1][1] == plan[3][1] > 2 * 100  # each rank's plan, gathered then scattered (padded alike)
            write = got[end + 1 : end + 5]
            assert [k for k, _ in write] == ["all_gather", "gather", "broadcast", "broadcast"]
            assert write[3][1] == len(pickle.dumps(FileSystemReader(str(folder)).read_metadata()))
        load = got[saves[1] + 5 :]
        for start in (0, 7):  # the two loads: plan gathered and scattered, then the "read" all-gather
            assert [k for k, _ in load[start : start + 7]] == ["all_gather", "gather", "broadcast", "scatter"] + [
                "scatter",
                "all_gather",
                "all_gather",
            ]
            assert load[start + 6][1] == 2 * len(pickle.dumps(None))
