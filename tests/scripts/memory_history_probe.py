"""Run by tests/test_memory_history.py on a phantora rank: torch.cuda.memory's history and snapshot, as a GPU program
uses them. Writes what it saw (JSON) to argv[1] and the dumped snapshot beside it."""

import json
import pickle
import sys

import torch
from torch.cuda import _memory_viz

out = sys.argv[1]
dev = torch.cuda.current_device()
before = torch.empty(300 << 10, dtype=torch.float32, device="cuda")  # 1.2 MiB: large pool, before recording
torch.cuda.memory._record_memory_history(max_entries=100_000)
a = torch.empty(1000, dtype=torch.uint8, device="cuda")  # 1024 B, small pool
b = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # 3 MiB, large pool
c = torch.ones(100, device="cuda") * 2  # two 400 B -> 512 B blocks, the first freed at once
del a, before
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot(out + ".pickle")
with open(out + ".pickle", "rb") as f:
    dumped = pickle.load(f)
summary = _memory_viz.segsum(dumped)
flame = _memory_viz.memory(dumped, format_flamegraph=lambda lines: lines)
html = _memory_viz.trace_plot(dumped)
reserved = torch.cuda.memory_reserved()
torch.cuda.memory._record_memory_history(enabled=None)
after_stop = torch.cuda.memory._snapshot()
# Megatron's form (model_provider.py, --record-memory-history): the legacy call and an OOM observer that dumps
torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100000, trace_alloc_record_context=True)
observed = []
torch._C._cuda_attach_out_of_memory_observer(lambda *seen: observed.append(list(seen)))
try:
    torch.empty(torch.cuda.get_device_properties(dev).total_memory, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    pass
oom = [[e["action"], e["size"], e["frames"][:1]] for e in torch.cuda.memory._snapshot()["device_traces"][dev]]
json.dump(
    {
        "observed": observed,
        "oom": oom,
        "total": torch.cuda.get_device_properties(dev).total_memory,
        "allocated": torch.cuda.memory_allocated(),
        "segments": [
            {
                "type": s["segment_type"],
                "total": s["total_size"],
                "address": s["address"],
                "blocks": [[bl["address"], bl["size"], bl["state"], bl["frames"][:1]] for bl in s["blocks"]],
            }
            for s in snap["segments"]
        ],
        "trace": [[e["action"], e["addr"], e["size"], e["frames"][:1]] for e in snap["device_traces"][dev]],
        "devices": len(snap["device_traces"]),
        "same_dump": dumped == snap,
        "segsum": summary,
        "flame": flame,
        "html": "MemoryViz.js" in html,
        "reserved": reserved,
        "after_stop": [len(t) for t in after_stop["device_traces"]],
        "after_stop_segments": len(after_stop["segments"]),
        "script": __file__,
    },
    open(out, "w"),
)
