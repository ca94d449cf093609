"""torch.cuda.memory's allocator history (phantora/runtime/memory_history.py), checked against closed forms.

The caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp): sizes round up to 512 B; requests of at most
1 MiB share 2 MiB small-pool segments; larger ones under 10 MiB split 20 MiB segments; larger still reserve their
size rounded up to 2 MiB. A session without the bridge and the charging dispatch mode run the allocations; the
last test runs a real rank (slow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.cuda import _memory_viz

from phantora.perfmodel.gpus import get_gpu
from phantora.runtime import memory_history
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "scripts" / "memory_history_probe.py"


def new_session() -> RankSession:
    return RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")


def snap(s: RankSession) -> dict[str, Any]:
    return memory_history.snapshot(s.memory, lambda: 0.0, 0, 1)


def actions(sn: dict[str, Any]) -> list[tuple[str, int]]:
    return [(e["action"], e["size"]) for e in sn["device_traces"][0]]


def test_blocks_are_the_allocators_rounded_sizes_and_the_trace_lists_allocs_and_frees_in_order() -> None:
    s = new_session()
    with ChargeMode(s):
        memory_history.record(s.memory, lambda: 0.0)
        a = torch.empty(1000, dtype=torch.uint8)  # 1000 B -> 1024 B in a 2 MiB small segment
        line_a = sys._getframe().f_lineno - 1
        b = torch.empty(3 * MIB, dtype=torch.uint8)  # a 20 MiB large segment, split
        c = torch.empty(5 * MIB, dtype=torch.uint8)  # the rest of that segment, split again
        d = torch.empty(14 * MIB, dtype=torch.uint8)  # >= 10 MiB, no cached block fits: its own 14 MiB segment
        del a
        sn = snap(s)
    assert actions(sn) == [
        ("segment_alloc", 2 * MIB), ("alloc", 1024),
        ("segment_alloc", 20 * MIB), ("alloc", 3 * MIB), ("alloc", 5 * MIB),
        ("segment_alloc", 14 * MIB), ("alloc", 14 * MIB),
        ("free_requested", 1024), ("free_completed", 1024),
    ]  # fmt: skip
    trace = sn["device_traces"][0]
    assert trace[1]["addr"] == trace[7]["addr"] == trace[8]["addr"]  # the free names the block allocated
    assert trace[1]["frames"][0] == {"filename": __file__, "line": line_a, "name": sys._getframe().f_code.co_name}
    segs = {seg["segment_type"] + str(seg["total_size"] // MIB): seg for seg in sn["segments"]}
    assert sorted(segs) == ["large14", "large20", "small2"]
    large = segs["large20"]["blocks"]
    assert [(bl["size"], bl["state"]) for bl in large] == [
        (3 * MIB, "active_allocated"), (5 * MIB, "active_allocated"), (12 * MIB, "inactive"),
    ]  # fmt: skip
    assert large[1]["address"] == large[0]["address"] + 3 * MIB == segs["large20"]["address"] + 3 * MIB
    assert [(bl["size"], bl["state"]) for bl in segs["small2"]["blocks"]] == [(2 * MIB, "inactive")]
    assert segs["large20"]["allocated_size"] == 8 * MIB
    assert sum(seg["total_size"] for seg in sn["segments"]) == s.memory.allocator.reserved == 36 * MIB
    del b, c, d


def test_a_block_from_before_recording_is_in_the_snapshot_and_its_free_in_the_trace() -> None:
    s = new_session()
    with ChargeMode(s):
        early = torch.empty(300, dtype=torch.float32)  # 1200 B -> 1536 B
        memory_history.record(s.memory, lambda: 0.0)
        late = torch.empty(100, dtype=torch.float32)  # 400 B -> 512 B, placed after it
        blocks = [bl for seg in snap(s)["segments"] for bl in seg["blocks"]]
        assert [(bl["size"], bl["state"]) for bl in blocks] == [
            (1536, "active_allocated"), (512, "active_allocated"), (2 * MIB - 2048, "inactive"),
        ]  # fmt: skip
        del early
        sn = snap(s)
    assert actions(sn) == [("alloc", 512), ("free_requested", 1536), ("free_completed", 1536)]
    assert sn["device_traces"][0][1]["addr"] == blocks[0]["address"]
    del late


def test_empty_cache_frees_segments_max_entries_keeps_the_last_and_none_stops() -> None:
    s = new_session()
    with ChargeMode(s):
        memory_history.record(s.memory, lambda: 0.0, max_entries=3)
        x = torch.empty(3 * MIB, dtype=torch.uint8)
        y = torch.empty(100, dtype=torch.uint8)
        del x, y
        s.memory.allocator.empty_cache()
        sn = snap(s)
        assert actions(sn) == [("free_completed", 512), ("segment_free", 20 * MIB), ("segment_free", 2 * MIB)]
        assert sn["segments"] == []
        memory_history.record(s.memory, lambda: 0.0, enabled=None)
        assert "on_tensor" not in vars(s.memory) and s.memory._history is None  # the fast path is back
        z = torch.empty(100, dtype=torch.uint8)
        sn = snap(s)
    assert sn["device_traces"] == [[]]  # stopping clears the trace, as the allocator's recordHistory(false)
    assert [bl["size"] for seg in sn["segments"] for bl in seg["blocks"]] == [512, 2 * MIB - 512]  # state still
    del z


def test_expandable_segments_map_pages_at_the_end_of_one_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    """expandable_segments:True: the large pool's one segment grows in 20 MiB pages (torch's segment_map); a 30 MiB
    request after a 3 MiB one finds 17 MiB free at the end and maps one more page: 40 MiB, blocks 3 + 30 + 7."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    s = new_session()
    with ChargeMode(s):
        memory_history.record(s.memory, lambda: 0.0)
        kept = [torch.empty(3 * MIB, dtype=torch.uint8), torch.empty(30 * MIB, dtype=torch.uint8)]
        sn = snap(s)
        del kept
        s.memory.allocator.empty_cache()
        after = snap(s)
    trace = sn["device_traces"][0]
    mapped = [("segment_map", 20 * MIB), ("alloc", 3 * MIB), ("segment_map", 20 * MIB), ("alloc", 30 * MIB)]
    assert actions(sn) == mapped
    base = trace[0]["addr"]
    assert [e["addr"] - base for e in trace] == [0, 0, 20 * MIB, 3 * MIB]
    (seg,) = sn["segments"]
    assert seg["is_expandable"] and seg["total_size"] == 40 * MIB and seg["address"] == base
    assert [bl["size"] for bl in seg["blocks"]] == [3 * MIB, 30 * MIB, 7 * MIB]
    assert actions(after)[-1] == ("segment_unmap", 40 * MIB) and after["segments"] == []


def test_bad_arguments_are_refused_in_one_line() -> None:
    s = new_session()
    with pytest.raises(ValueError, match="context must be"):
        memory_history.record(s.memory, lambda: 0.0, context="everything")
    with pytest.raises(ValueError, match="skip_actions has unknown"):
        memory_history.record(s.memory, lambda: 0.0, skip_actions=["allocs"])


def test_memory_viz_reads_the_snapshot() -> None:
    s = new_session()
    with ChargeMode(s):
        memory_history.record(s.memory, lambda: 0.0)
        kept = [torch.empty(4 * MIB, dtype=torch.uint8), torch.empty(2048, dtype=torch.uint8)]
        sn = snap(s)
    summary = _memory_viz.segsum(sn)
    assert "total_reserved: 22.0MiB" in summary and "total_allocated: 4.0MiB" in summary
    lines = _memory_viz.memory(sn, format_flamegraph=lambda text: text).splitlines()
    active = [int(line.rsplit(" ", 1)[1]) for line in lines if ";active_allocated;" in line]
    assert sorted(active) == [2048, 4 * MIB]
    assert "Active Memory Timeline" in _memory_viz.trace_plot(sn)
    del kept


@pytest.mark.slow
@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_rank_records_snapshots_and_dumps_as_on_a_gpu(tmp_path: Path, tensors: str) -> None:
    from phantora.launcher import RunConfig, launch

    out = tmp_path / "seen.json"
    launch(RunConfig(str(PROBE), [str(out)], "testbed16", nproc=1, tensors=tensors, timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen["same_dump"] and seen["html"] and seen["devices"] == 1
    trace = [(a, size) for a, _, size, _ in seen["trace"]]
    assert trace == [
        ("segment_alloc", 2 * MIB), ("alloc", 1024), ("alloc", 3 * MIB),  # in the segment `before` made
        ("alloc", 512), ("alloc", 512), ("free_requested", 512), ("free_completed", 512),
        ("free_requested", 1024), ("free_completed", 1024),
        ("free_requested", 1200 * 1024), ("free_completed", 1200 * 1024),
    ]  # fmt: skip  # `before` (1.2 MiB, allocated by the compiled per-op path before recording) freed with `a`
    assert seen["trace"][1][3][0]["line"] == 15 and seen["trace"][1][3][0]["filename"] == seen["script"]
    assert seen["reserved"] == sum(seg["total"] for seg in seen["segments"]) == 22 * MIB
    assert "total_reserved: 22.0MiB" in seen["segsum"]
    assert seen["after_stop"] == [0] and seen["after_stop_segments"] == 2
    # Megatron's legacy call and OOM observer: the observer sees (device, bytes asked, allocated, free), the trace
    # holds the `oom` entry with its frame (the legacy call's trace_alloc_record_context: alloc frames)
    assert seen["observed"] == [[0, seen["total"], seen["allocated"], seen["observed"][0][3]]]
    assert [(a, size) for a, size, _ in seen["oom"]] == [("oom", seen["total"])]
    assert seen["oom"][0][2][0]["filename"] == seen["script"]
