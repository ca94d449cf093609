"""Flow tags (flows.csv `tag`) name the call and its ranks, so two groups' flows never share one.

Each group numbers its collectives from 0, so before, two groups' first all-reduces both tagged their flows
`all_reduce#0`, two pairs' first sends `send#0`, and the shifted copies of a deduplicated run's collective all
carried the live group's tag. The tags checked here follow from the program alone (its groups, calls and pairs), in
the live run, its recording replayed on the flow network and on ns-3.
"""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.collectives.flow_tags import parse_ranks, ranks_text, transfer_tag
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.collectives.spec import AlgoOptions
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.topology.generators import leaf_spine


def call_of(tag: str) -> str:
    """A flow tag's call part: up to the engine's parts (`/ring/ch0`, `/p2p`), with a pairwise call's pair."""
    parts = tag.split("/")
    return parts[0] + (f"/{parts[1]}" if len(parts) > 1 and ">" in parts[1] else "")


@pytest.mark.parametrize(
    ("ranks", "text"),
    [((0, 1, 2, 3), "0-3"), ((0, 8, 16, 24), "0-24:8"), ((0, 1), "0.1"), ((3, 1), "3.1"), ((0, 2, 5), "0.2.5")],
)
def test_ranks_text_is_short_and_reads_back(ranks: tuple[int, ...], text: str) -> None:
    assert ranks_text(ranks) == text and parse_ranks(text) == ranks


def test_each_shift_of_a_deduplicated_call_tags_its_own_ranks() -> None:
    """8 ranks run by 4 live processes: a call on (0, 1) stands for (0, 1) and (4, 5); a pairwise all-to-all's
    transfer 0 -> 2 of group 0-3 stands for 4 -> 6 of group 4-7."""
    topo = leaf_spine(1, 8, 0, name="star8")
    planner = CollectivePlanner(topo, AlgoOptions(model="ideal"), Mirrors(8, 4))
    plan = planner.plan(CallSpec("all_reduce", (0, 1), 4096, "fp32"), "all_reduce#0")
    assert {call_of(f.tag) for f in plan.flows} == {"all_reduce#0@0.1", "all_reduce#0@4.5"}
    plan = planner.plan(CallSpec("send_recv", (0, 2), 4096, "uint8"), "all_to_all#0@0-3")
    assert {call_of(f.tag) for f in plan.flows} == {"all_to_all#0@0-3/0>2", "all_to_all#0@4-7/4>6"}
    assert transfer_tag("send#2.tag7", 3, 1) == "send#2.tag7@3>1"


PROGRAM = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    a, b = dist.new_group([0, 1]), dist.new_group([2, 3])
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x, group=a if rank < 2 else b)  # all_reduce#0 on each pair
    if rank % 2 == 0:
        dist.send(x, rank + 1)  # send#0 on each pair
    else:
        dist.recv(x, rank - 1)
    parts = [torch.ones(256, device="cuda") for _ in range(4)] if rank == 0 else None
    dist.gather(torch.ones(256, device="cuda"), parts, dst=0)  # pair by pair, to rank 0
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""
EXPECTED = {
    "all_reduce#0@0.1",
    "all_reduce#0@2.3",
    "send#0@0>1",
    "send#0@2>3",
    "gather#0@0-3/1>0",
    "gather#0@0-3/2>0",
    "gather#0@0-3/3>0",
}


def call_tags(flows_csv: Path) -> dict[str, list[tuple[str, str]]]:
    """flows.csv's traffic (no zero-byte markers) by the call part of its tag (before the engine's `/ring`, `/p2p`)."""
    out: dict[str, list[tuple[str, str]]] = {}
    with open(flows_csv) as f:
        for r in csv.DictReader(f):
            if int(r["size_bytes"]) == 0:
                continue
            out.setdefault(call_of(r["tag"]), []).append((r["src"], r["dst"]))
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tags")
    script = d / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    cfg = RunConfig(str(script), topology="testbed16", nproc=4, out_dir=d / "live", trace="none", timeout_s=120)
    record_run(cfg, d / "rec")
    return d / "live", d / "rec"


def check(tags: dict[str, list[tuple[str, str]]]) -> None:
    assert set(tags) == EXPECTED
    for tag, pairs in tags.items():  # every flow runs between the ranks its tag names
        ranks = tag.split("@")[1]
        if ">" in ranks:
            src, dst = ranks.split("/")[-1].split(">")
            assert set(pairs) == {(f"gpu{src}", f"gpu{dst}")}, tag
        else:
            assert {g for p in pairs for g in p} == {f"gpu{r}" for r in parse_ranks(ranks)}, tag


def test_a_live_runs_flows_name_their_group(recorded: tuple[Path, Path]) -> None:
    check(call_tags(recorded[0] / "flows.csv"))


@pytest.mark.parametrize("network", ["flow", pytest.param("ns3", marks=pytest.mark.slow)])
def test_its_replay_tags_the_flows_as_the_live_run(recorded: tuple[Path, Path], tmp_path: Path, network: str) -> None:
    out = tmp_path / network
    assert main(["replay", str(recorded[1]), "--topology", "testbed16", "--network", network, "--out", str(out)]) == 0
    check(call_tags(out / "flows.csv"))


@pytest.mark.slow
def test_a_live_packet_runs_flows_name_their_group(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "live"
    ns3 = EngineSpec(network="ns3")
    launch(RunConfig(str(script), topology="testbed16", engine=ns3, nproc=4, out_dir=out, trace="none", timeout_s=240))
    check(call_tags(out / "flows.csv"))
