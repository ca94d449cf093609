"""The idle-fabric check (phantora.results.idle): a packet-level run whose traffic never reaches a switch says
so in its summary and results.json, naming the settings that then had no effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.launcher import RunConfig, launch
from phantora.results.idle import IDLE_SHARE, idle_fabric, no_effect_settings
from phantora.results.summary import format_summary
from phantora.topology.generators import leaf_spine

SCRIPT = """
import os
import torch
import torch.distributed as dist
import phantora.runtime

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
for _ in range(2):
    grad = torch.empty(1 << 18, device="cuda")
    dist.all_reduce(grad)
    phantora.runtime.step()
dist.destroy_process_group()
"""


def test_the_settings_named_are_those_given_that_act_in_the_switches() -> None:
    sets = ["buffer_bytes=4000000", "pfc=false", "payload_bytes=4096", "cc.G=0.1", "nvlink=fluid"]
    assert no_effect_settings("dcqcn", sets) == [
        "--cc dcqcn",
        "--set buffer_bytes=4000000",
        "--set pfc=false",
        "--set cc.G=0.1",
    ]
    assert no_effect_settings("none", []) == no_effect_settings(None, []) == []


def test_the_threshold_is_a_share_of_the_bytes() -> None:
    total = 1_000_000
    edge = int(IDLE_SHARE * total)
    assert idle_fabric({"network": total, "fabric": edge}, "dcqcn", []) is None
    under = idle_fabric({"network": total, "fabric": edge - 1}, "dcqcn", [])
    assert under is not None and under["fabric_share"] == pytest.approx((edge - 1) / total)
    assert "only 1.00% of the bytes (10.0 KB of 1.0 MB) crossed a switch" in under["text"]
    assert "--cc dcqcn had next to no effect" in under["text"]
    none = idle_fabric({"network": total, "fabric": 0}, None, [], host_gpus=8, topology="testbed16")
    assert none is not None and none["no_effect"] == []
    assert "the congestion control, switch buffers and PFC had no effect" in none["text"]
    assert none["text"].endswith("more ranks than one host has GPUs (8 on testbed16)")
    assert idle_fabric({}, "dcqcn", []) is None  # counts not recorded: nothing said


def run(tmp_path: Path, nproc: int) -> tuple[dict[str, Any], str]:
    """A 2-step all-reduce on 2 hosts x 2 GPUs (NVSwitch) under one switch, DCQCN, a 1 MB buffer."""
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    topo = leaf_spine(1, 4, 0, gpus_per_host=2, name="two-hosts")
    out = tmp_path / f"n{nproc}"
    cfg = RunConfig(
        script=str(script), topology=topo, network="ns3", cc="dcqcn", packet_set=["buffer_bytes=1000000"],
        nproc=nproc, out_dir=out, trace="none",
    )  # fmt: skip
    report = launch(cfg)
    return json.loads((out / "results.json").read_text()), format_summary(report.summary)


@pytest.mark.ns3
def test_a_run_inside_one_host_says_the_fabric_was_idle(ns3_lib: Any, tmp_path: Path) -> None:
    doc, printed = run(tmp_path, nproc=2)  # ranks 0 and 1: one host, NVLink only
    net = doc["network"]
    assert net["traffic_bytes"]["fabric"] == 0 and net["traffic_bytes"]["network"] > 0
    idle = net["idle_fabric"]
    assert idle["no_effect"] == ["--cc dcqcn", "--set buffer_bytes=1000000"]
    assert "no flow crossed a switch" in idle["text"] and "(2 on two-hosts)" in idle["text"]
    assert f"note: {idle['text']}" in printed


@pytest.mark.ns3
def test_a_run_across_hosts_says_nothing(ns3_lib: Any, tmp_path: Path) -> None:
    doc, printed = run(tmp_path, nproc=4)  # two hosts: the ring crosses the switch
    net = doc["network"]
    assert net["traffic_bytes"]["fabric"] >= IDLE_SHARE * net["traffic_bytes"]["network"] > 0
    assert "idle_fabric" not in net and "fabric was idle" not in printed
