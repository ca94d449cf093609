"""The idle-fabric check (phantora.results.idle): a packet-level run whose traffic never reaches a switch says
so in its summary and results.json, naming the settings that then had no effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.launcher import RunConfig, launch
from phantora.netsim.base import Completion
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.results.idle import IDLE_SHARE, idle_fabric, idle_fabric_on, no_effect_settings, traffic_of
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
    assert none["text"].endswith(
        "more ranks than one host has GPUs (8 on testbed16), or place them across the hosts (--placement spread, or a "
        "list of GPUs)"
    )
    assert idle_fabric({}, "dcqcn", []) is None  # counts not recorded: nothing said


def test_the_hints_placement_puts_a_few_ranks_on_two_hosts() -> None:
    """What the hint offers does what it says: `--placement spread` of 4 ranks on testbed16 (8 GPUs a host) gives
    GPUs 0, 1, 8, 9, ranks 0-1 on host 0 and 2-3 on host 1 (the user trial's TP 2 x FSDP 2: each FSDP pair across)."""
    from phantora.topology.loader import load_topology
    from phantora.topology.placement import place_run

    topo, n = place_run(load_topology("testbed16"), "spread", 4)
    hosts = [topo.nodes[topo.endpoints[r]].host for r in range(n)]
    assert n == 4 and hosts == [0, 0, 1, 1]


def run(tmp_path: Path, nproc: int) -> tuple[dict[str, Any], str]:
    """A 2-step all-reduce on 2 hosts x 2 GPUs (NVSwitch) under one switch, DCQCN, a 1 MB buffer."""
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    topo = leaf_spine(1, 4, 0, gpus_per_host=2, name="two-hosts")
    out = tmp_path / f"n{nproc}"
    engine = engine_spec_from_flags("ns3", cc="dcqcn", sets=["buffer_bytes=1000000"])
    cfg = RunConfig(script=str(script), topology=topo, engine=engine, nproc=nproc, out_dir=out, trace="none")
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


def test_traffic_counted_from_completions_splits_nvlink_and_fabric() -> None:
    """Two hosts of two GPUs under one switch: endpoints 0, 1 share host 0 (NVLink), 0 -> 2 crosses the switch;
    a self-flow and an empty flow carry nothing."""
    topo = leaf_spine(1, 4, 0, gpus_per_host=2, name="two-hosts")
    done = [
        Completion(0, 0, 10, 1000, 0, 1),
        Completion(1, 0, 10, 300, 0, 2),
        Completion(2, 0, 10, 300, 2, 0),
        Completion(3, 0, 10, 50, 3, 3),
        Completion(4, 0, 10, 0, 1, 3),
    ]
    assert traffic_of(topo, done) == {"network": 1600, "fabric": 600}
    assert traffic_of(topo, done[:1]) == {"network": 1000, "fabric": 0}
    idle = idle_fabric_on(topo, traffic_of(topo, done[:1]), "dcqcn", [])
    assert idle is not None and idle["text"].endswith(
        "(2 on two-hosts), or place them across the hosts (--placement spread, or a list of GPUs)"
    )
    assert idle_fabric_on(topo, traffic_of(topo, done), "dcqcn", []) is None


ONE_HOST = """
name = "one-host"
[[op]]
name = "ar"
kind = "all_reduce"
bytes = "1MiB"
ranks = [0, 1, 2, 3]
"""


@pytest.mark.ns3
def test_a_packet_replay_inside_one_host_says_the_fabric_was_idle(
    ns3_lib: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ranks 0-3 of testbed16 share a host (8 GPUs): the replay prints the note and results.json keeps it."""
    wl = tmp_path / "wl.toml"
    wl.write_text(ONE_HOST)
    out = tmp_path / "r"
    args = ["replay", str(wl), "-t", "testbed16", "--network", "ns3", "--cc", "dcqcn", "--set", "pfc=false"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    idle = json.loads((out / "results.json").read_text())["idle_fabric"]
    assert idle["fabric_bytes"] == 0 and idle["network_bytes"] > 0
    assert idle["no_effect"] == ["--cc dcqcn", "--set pfc=false"]
    assert f"note: {idle['text']}" in printed and "(8 on testbed16)" in idle["text"]


@pytest.mark.ns3
def test_netsim_says_the_fabric_was_idle_only_when_no_flow_crossed_a_switch(
    ns3_lib: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """testbed16's GPUs 0-7 are one host: 1 -> 0 and 2 -> 0 stay on NVLink; 8 -> 0 crosses the fabric."""
    for name, src in (("inside", 2), ("across", 8)):
        flows = tmp_path / f"{name}.flows.txt"
        flows.write_text(f"2\n1 0 3 100 100000 0.000001\n{src} 0 3 100 100000 0.000001\n")
        out = tmp_path / name
        args = ["netsim", "-t", "testbed16", "--flows", str(flows), "--network", "ns3", "--cc", "dcqcn"]
        assert main([*args, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        summary = json.loads((out / "summary.json").read_text())
        if name == "inside":
            assert summary["idle_fabric"]["fabric_bytes"] == 0 and summary["idle_fabric"]["network_bytes"] == 200_000
            assert f"note: {summary['idle_fabric']['text']}" in printed
        else:  # half the bytes through a switch: well above the threshold
            assert "idle_fabric" not in summary and "fabric was idle" not in printed


@pytest.mark.ns3
def test_packet_replay_of_two_jobs_inside_one_host_says_the_fabric_was_idle(
    ns3_lib: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 2-rank workload jobs packed on testbed16's first host (8 GPUs): their all-reduces stay on NVLink."""
    (tmp_path / "wl.toml").write_text(ONE_HOST.replace("ranks = [0, 1, 2, 3]", 'ranks = "all"'))
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[[job]]\nname = "a"\nworkload = "wl.toml"\nranks = 2\nplacement = "packed"\n'
        '[[job]]\nname = "b"\nworkload = "wl.toml"\nranks = 2\nplacement = "packed"\n'
    )
    out = tmp_path / "out"
    args = ["replay", "-t", "testbed16", "--jobs", str(jobs), "--network", "ns3", "--cc", "hpcc", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    idle = json.loads((out / "results.json").read_text())["idle_fabric"]
    assert idle["fabric_bytes"] == 0 and idle["no_effect"] == ["--cc hpcc"]
    assert f"note: {idle['text']}" in printed
