"""README's and the tutorials' examples that set network options cross hosts: `run`, `replay`, `netsim` lines.

A run whose ranks fit one host moves no byte through a switch, so its `--cc`, `--set` or `--network ns3` would
do nothing (the run says so: the idle-fabric note). An example that demonstrates network settings must cross
hosts: a `run` or `replay` line places its ranks on more than one host, a `netsim` line's flows put at least
`IDLE_SHARE` of their bytes through a switch (the idle-fabric check itself). README's "LLM scale" replay lines
replay a trace that an earlier README line records from an LLM script.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from phantora.cli import build_parser
from phantora.commands.netsim import read_netsim_input
from phantora.results.idle import IDLE_SHARE, traffic_of
from phantora.topology import load_topology
from phantora.workload import load_workload
from tests.test_docs_commands import commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "tutorial.md", ROOT / "docs" / "tutorial-cc.md"]


def hosts_used(topology: str, nproc: int | None) -> int:
    """How many hosts the first `nproc` ranks of a topology (all of them when None) sit on."""
    topo = load_topology(topology)
    n = topo.num_ranks if nproc is None else nproc
    return len({topo.nodes[topo.node_of_rank(r)].host for r in range(n)})


def _parsed(path: Path) -> list[tuple[int, str, argparse.Namespace]]:
    """(line, command, parsed arguments) of a doc's phantora commands."""
    parser = build_parser()
    return [(line, cmd, parser.parse_args(shlex.split(cmd))) for line, cmd in commands(path)]


def _sets_network(args: argparse.Namespace) -> bool:
    return args.network == "ns3" or args.cc is not None or bool(args.set)


def recorded_traces(path: Path) -> dict[str, argparse.Namespace]:
    """{trace directory: the `run` arguments that record it} of a doc's `run --record DIR` lines."""
    runs = [args for _, _, args in _parsed(path) if args.command == "run"]
    return {args.record: args for args in runs if getattr(args, "record", None)}


def replay_ranks(args: argparse.Namespace, path: Path = README) -> int:
    """How many ranks a `replay` line of the doc `path` replays: --scale-dp's N, else a workload's highest
    rank + 1, or a recorded trace's rank count (from the doc's line that records it)."""
    if args.scale_dp:
        return int(args.scale_dp)
    source = args.workload
    traces = recorded_traces(path)
    if source in traces:
        rec = traces[source]
        return int(rec.nproc if rec.nproc is not None else load_topology(rec.topology).num_ranks)
    topo = load_topology(args.topology)
    return int(load_workload(source, world=topo.num_ranks).max_rank + 1)


Example = tuple[Path, int, str, argparse.Namespace]


def network_examples(kind: str) -> list[Example]:
    """The docs' single-job lines of `kind` (run, replay, netsim) that set network options."""
    return [
        (path, line, cmd, args)
        for path in DOCS
        for line, cmd, args in _parsed(path)
        if args.command == kind and _sets_network(args) and not getattr(args, "jobs", None)
    ]


RUNS = network_examples("run")
REPLAYS = network_examples("replay")
NETSIMS = network_examples("netsim")


def _ids(examples: list[Example]) -> list[str]:
    return [f"{path.name}:{line}" for path, line, _, _ in examples]


def test_the_docs_have_network_examples_of_each_kind() -> None:
    assert len(RUNS) >= 3 and len(REPLAYS) >= 4 and len(NETSIMS) >= 5
    assert {p.name for p, _, _, _ in REPLAYS + NETSIMS} == {"README.md", "tutorial.md", "tutorial-cc.md"}


def test_one_host_is_detected() -> None:
    assert hosts_used("testbed16", 8) == 1 and hosts_used("testbed16", 9) == 2


def test_an_idle_netsim_is_detected() -> None:
    """Two flows inside one testbed16 host: nothing through a switch (what the netsim check below relies on)."""
    from phantora.netsim.base import Flow

    topo = load_topology("testbed16")
    inside = [Flow(0, topo.node_of_rank(0), topo.node_of_rank(1), 1 << 20), Flow(1, 2, 3, 1 << 20)]
    assert traffic_of(topo, inside)["fabric"] == 0
    across = [Flow(0, topo.node_of_rank(0), topo.node_of_rank(8), 1 << 20)]
    assert traffic_of(topo, across) == {"network": 1 << 20, "fabric": 1 << 20}


@pytest.mark.parametrize(("path", "line", "command", "args"), RUNS, ids=_ids(RUNS))
def test_a_network_run_example_crosses_hosts(path: Path, line: int, command: str, args: argparse.Namespace) -> None:
    assert hosts_used(args.topology, args.nproc) > 1, f"{path.name}:{line}: `phantora {command}` stays in one host"


@pytest.mark.parametrize(("path", "line", "command", "args"), REPLAYS, ids=_ids(REPLAYS))
def test_a_network_replay_example_crosses_hosts(path: Path, line: int, command: str, args: argparse.Namespace) -> None:
    ranks = replay_ranks(args, path)
    where = f"{path.name}:{line}: `phantora {command}` ({ranks} ranks)"
    assert hosts_used(args.topology, ranks) > 1, f"{where} stays in one host"


@pytest.mark.parametrize(("path", "line", "command", "args"), NETSIMS, ids=_ids(NETSIMS))
def test_a_network_netsim_example_loads_the_fabric(
    path: Path, line: int, command: str, args: argparse.Namespace
) -> None:
    topo = load_topology(args.topology)
    traffic = traffic_of(topo, read_netsim_input(args.flows, topo).flows)
    where = f"{path.name}:{line}: `phantora {command}`: {traffic}"
    assert traffic["fabric"] >= IDLE_SHARE * traffic["network"] > 0, where


def test_readme_llm_replays_replay_a_recorded_llm_step() -> None:
    """README's LLM-scale replay lines replay a trace that an earlier README line records from an LLM script."""
    recorded: dict[str, str] = {}
    llm_replays = 0
    for line in README.read_text().splitlines():
        m = re.search(r"--record (\S+) (\S+\.py)", line)
        if m:
            recorded[m.group(1)] = m.group(2)
        m = re.search(r"phantora replay (runs/\S+)", line)
        if m and "LLM" in line:
            llm_replays += 1
            assert m.group(1) in recorded, f"{m.group(1)} is replayed before any README line records it"
            assert "llama" in recorded[m.group(1)] or "mixtral" in recorded[m.group(1)], line
    assert llm_replays >= 2


def test_replay_ranks_counts_a_workload_and_a_recorded_trace(tmp_path: Path) -> None:
    wl = tmp_path / "four.toml"
    ops = '[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "1MiB"\n'
    wl.write_text('name = "four"\n[defaults]\nranks = [0, 1, 2, 3]\n' + ops)
    four = argparse.Namespace(workload=str(wl), topology="testbed16", scale_dp=None)
    assert replay_ranks(four) == 4 and hosts_used("testbed16", replay_ranks(four)) == 1  # one host: would fail
    assert replay_ranks(argparse.Namespace(workload="runs/trace64", topology="rail128", scale_dp=None)) == 64
    assert replay_ranks(argparse.Namespace(workload="runs/trace64", topology="rail128", scale_dp=128)) == 128
