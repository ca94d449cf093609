"""README's live-run examples that set network options place their ranks on more than one host.

A run whose ranks fit one host moves no byte through a switch, so its `--cc`, `--set` or `--network ns3` would
do nothing (the run says so: the idle-fabric note). An example that demonstrates network settings must cross
hosts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from phantora.cli import build_parser
from phantora.topology import load_topology
from tests.test_docs_commands import commands

ROOT = Path(__file__).resolve().parents[1]


def hosts_used(topology: str, nproc: int | None) -> int:
    """How many hosts the first `nproc` ranks of a topology (all of them when None) sit on."""
    topo = load_topology(topology)
    n = topo.num_ranks if nproc is None else nproc
    return len({topo.nodes[topo.node_of_rank(r)].host for r in range(n)})


def network_run_examples() -> list[tuple[int, str, str, int | None]]:
    """(line, command, topology, nproc) of README's single-job `run` lines that set network options."""
    out = []
    parser = build_parser()
    for line, cmd in commands(ROOT / "README.md"):
        argv = shlex.split(cmd)
        if argv[0] != "run":
            continue
        args = parser.parse_args(argv)
        sets_network = args.network == "ns3" or args.cc is not None or bool(args.set)
        if sets_network and not args.jobs:
            out.append((line, cmd, args.topology, args.nproc))
    return out


EXAMPLES = network_run_examples()


def test_the_readme_has_network_run_examples() -> None:
    assert len(EXAMPLES) >= 3


def test_one_host_is_detected() -> None:
    assert hosts_used("testbed16", 8) == 1 and hosts_used("testbed16", 9) == 2


@pytest.mark.parametrize(("line", "command", "topology", "nproc"), EXAMPLES, ids=[f"README:{e[0]}" for e in EXAMPLES])
def test_a_network_example_crosses_hosts(line: int, command: str, topology: str, nproc: int | None) -> None:
    assert hosts_used(topology, nproc) > 1, f"README.md:{line}: `phantora {command}` stays in one host"
