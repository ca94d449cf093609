"""The checkpoint storage model (phantora/runtime/storage.py), against closed forms: a file of B bytes costs a rank
B / min(host, shared) of simulated time when it has the storage alone, as it does in a session without the bridge
(no-network client); no process is started. Sharing between ranks: tests/test_storage_engine.py."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.results.run_dir import RunDir
from phantora.results.summary import summarize
from phantora.runtime import session as _session
from phantora.runtime import storage
from phantora.runtime.compute import Roofline
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.storage import StorageModel


def test_a_lone_file_has_the_smaller_bandwidth() -> None:
    assert StorageModel(2e9, None).lone_ns(10**9) == 500_000_000  # 1 GB at 2 GB/s
    assert StorageModel(2e9, 0.5e9).lone_ns(10**9) == 2 * 10**9  # the shared filesystem's 0.5 GB/s binds


def test_from_env() -> None:
    env = {"PHANTORA_STORAGE_GBPS": "8", "PHANTORA_SHARED_FS_GBPS": "16", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "64"}
    assert StorageModel.from_env(env) == StorageModel(8e9, 16e9)
    assert StorageModel.from_env({"LOCAL_WORLD_SIZE": "8"}) is None  # no --storage: nothing charged
    with pytest.raises(ValueError, match="PHANTORA_STORAGE_GBPS='fast'"):
        StorageModel.from_env({"PHANTORA_STORAGE_GBPS": "fast"})


@pytest.fixture
def charged(tmp_path: Path) -> Iterator[RankSession]:
    """A session without the bridge whose checkpoint files have a 0.25 GB/s storage to themselves (4 ns a byte)."""
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="ops", out_dir=tmp_path / "out")
    _session.install(s)
    storage.install(StorageModel(0.25e9, None))
    try:
        yield s
    finally:
        storage.uninstall()
        _session.install(None)


def test_torch_save_and_load_cost_four_ns_a_byte(charged: RankSession, tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(1000)}, path)
    size = os.path.getsize(path)
    assert charged.now() == 4 * size
    assert charged.storage == {"write": [size, 4 * size]}
    got = torch.load(path)
    assert torch.equal(got["w"], torch.ones(1000))
    assert charged.now() == 8 * size and charged.storage["read"] == [size, 4 * size]
    with open(tmp_path / "open.pt", "wb") as f:  # an open file: the bytes written to it
        torch.save(torch.zeros(10), f)
    assert charged.storage["write"][0] == size + os.path.getsize(tmp_path / "open.pt")
    before = charged.now()
    torch.save(torch.ones(1000), io.BytesIO())  # memory, not storage
    assert charged.now() == before


def test_a_save_given_by_keyword_is_charged(charged: RankSession, tmp_path: Path) -> None:
    """torch.save(obj=..., f=...) writes the file and is charged 4 ns a byte, as a positional save is."""
    path = tmp_path / "by_name.pt"
    torch.save(obj={"w": torch.ones(10)}, f=path)
    assert charged.storage == {"write": [os.path.getsize(path), 4 * os.path.getsize(path)]}


def test_checkpoint_time_is_in_the_step_and_the_trace(charged: RankSession, tmp_path: Path) -> None:
    torch.save(torch.ones(256), tmp_path / "a.pt")
    charged.step()
    charged.step()  # a step without a checkpoint
    size = os.path.getsize(tmp_path / "a.pt")
    out = RunDir(tmp_path / "out")
    lines = [json.loads(line) for line in out.rank_trace(0).read_text().splitlines()]
    events = [e for line in lines for e in line["events"]]
    spans = [e for e in events if e.get("cat") == "storage"]
    assert [(e["name"], e["dur"], e["args"]["bytes"]) for e in spans] == [("write a.pt", 4 * size / 1000, size)]
    res = charged.results()
    assert res["storage"] == {"write": {"bytes": size, "ns": 4 * size}} and res["step_storage_ns"] == [4 * size] * 2
    steps = [json.loads(line) for line in out.rank_steps(0).read_text().splitlines()]
    assert [(x["storage_bytes"], x["storage_ns"]) for x in steps] == [(size, 4 * size), (0, 0)]
    summary = summarize({0: res}, get_gpu("h100"))
    assert [st["storage_ns"] for st in summary["steps"]] == [4 * size, 0]
    assert summary["storage"] == {"write": {"bytes": size, "max_rank_ns": 4 * size}}
    assert summary["steps"][0]["exposed_ns"] == 0  # the stall is checkpoint I/O, not communication left exposed


def test_dcp_counts_its_data_files_once(charged: RankSession, tmp_path: Path) -> None:
    """DCP's FileSystemWriter: the bytes it reports, which are its data files' sizes (the torch.save it makes
    inside is not counted again); reading back costs the bytes read."""
    import torch.distributed.checkpoint as dcp

    state = {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(100, 10)}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    data = sum(p.stat().st_size for p in (tmp_path / "dcp").glob("*.distcp"))
    assert data > (4096 + 1000) * 4 and charged.storage["write"] == [data, 4 * data]
    back = {"a": torch.zeros(4096), "b": torch.zeros(100, 10)}
    dcp.load(back, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert torch.equal(back["a"], state["a"]) and charged.storage["read"][0] > (4096 + 1000) * 4
    assert charged.storage["read"][0] <= data


def test_uninstalled_nothing_is_charged(tmp_path: Path) -> None:
    assert not getattr(torch.save, "_phantora_storage", False)
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    _session.install(s)
    try:
        torch.save(torch.ones(10), tmp_path / "x.pt")
    finally:
        _session.install(None)
    assert s.now() == 0 and s.storage == {}


def test_safetensors_files_are_charged(charged: RankSession, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file  # imported after install, as a program imports it

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(300)}, path)
    size = os.path.getsize(path)
    assert size > 1200 and charged.storage == {"write": [size, 4 * size]}
    assert torch.equal(load_file(path)["w"], torch.ones(300)) and charged.storage["read"] == [size, 4 * size]
