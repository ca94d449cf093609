"""A recording keeps the NCCL settings each call ran under, and a replay runs it under them.

A program that sets NCCL variables itself (`os.environ["NCCL_PROTO"] = "LL"`) before it creates a group runs that
group's collectives under them (runtime/program_env.py). The recording stores those per call (Coll/P2P.nccl_env,
egraph/format.py) beside the run's own (meta.algo.nccl_env); a replay takes them, each variable the replaying
process sets replacing its value for every call (egraph/call_env.py). Lone sends recorded under buffer registration
cannot be replayed without it (they were recorded without hand-offs): refused in one line.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgpack
import pytest

from phantora.egraph.builder import ProgramBuilder, build_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import P2P, Coll, Program
from phantora.egraph.live import record_run
from phantora.egraph.replay import algo_from_meta, replay_graph
from phantora.errors import InputError
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

LL = (("NCCL_PROTO", "LL"),)
REG = (("PHANTORA_NCCL_REGISTER", "1"),)
VARS = ("NCCL_ALGO", "NCCL_PROTO", "PHANTORA_NCCL_REGISTER")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)


def test_a_calls_own_variables_survive_the_program_file() -> None:
    b = ProgramBuilder(0)
    b.collective("all_reduce", (0, 1), 4096, "fp32", nccl_env=LL)
    b.collective("all_reduce", (0, 1), 4096, "fp32")
    b.p2p(1, True, 4096, nccl_env=REG)
    prog, _ = b.build()
    back = Program.decode(prog.encode())
    assert [n.nccl_env for n in back.nodes if isinstance(n, Coll | P2P)] == [LL, None, REG]
    # a program written before the settings were recorded (no envs / env_of keys) reads as the run's settings
    old = msgpack.unpackb(prog.encode(), raw=False)
    del old["envs"], old["env_of"]
    assert all(getattr(n, "nccl_env", None) is None for n in Program.decode(msgpack.packb(old)).nodes)
    old["envs"], old["env_of"] = [[["NCCL_PROTO", "LL"]]], [[0, 3]]
    with pytest.raises(InputError, match="env_of entry") as exc:
        Program.decode(msgpack.packb(old), "p0.msgpack")
    assert exc.value.field == "env_of"


def test_the_replays_own_variables_replace_the_recorded_ones_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = build_graph([ProgramBuilder(0)], meta={"algo": {"nccl_env": [["NCCL_ALGO", "Tree"]]}})
    assert algo_from_meta(graph).nccl_env == (("NCCL_ALGO", "Tree"),)
    monkeypatch.setenv("NCCL_PROTO", "LL")  # asked for: it joins the recorded NCCL_ALGO, which stays
    assert algo_from_meta(graph).nccl_env == (("NCCL_ALGO", "Tree"), ("NCCL_PROTO", "LL"))
    monkeypatch.setenv("NCCL_ALGO", "")  # an empty value drops a recorded variable
    assert algo_from_meta(graph).nccl_env == (("NCCL_PROTO", "LL"),)


def _lone_send(send_env: tuple[tuple[str, str], ...] | None, meta: dict) -> object:
    ranks = [ProgramBuilder(0), ProgramBuilder(1)]
    ranks[0].p2p(1, True, 256 * 1024, nccl_env=send_env)
    ranks[1].p2p(0, False, 256 * 1024, nccl_env=send_env)
    return build_graph(ranks, meta=meta)


@pytest.mark.parametrize(("send_env", "meta"), [(REG, {}), (None, {"algo": {"nccl_env": [list(REG[0])]}})])
def test_registered_lone_sends_replayed_without_registration_are_refused(
    monkeypatch: pytest.MonkeyPatch, send_env: tuple[tuple[str, str], ...] | None, meta: dict
) -> None:
    """Set by the program for the send's group, or for the whole run: replayed as recorded it runs; with the
    replay's PHANTORA_NCCL_REGISTER=0 it is refused, naming the variable."""
    topo = load_topology("testbed16")
    graph = _lone_send(send_env, meta)
    assert replay_graph(graph, topo, FlowSimulator(topo)).rank_end_ns  # as recorded: runs
    monkeypatch.setenv("PHANTORA_NCCL_REGISTER", "0")
    with pytest.raises(InputError, match="PHANTORA_NCCL_REGISTER=1") as exc:
        replay_graph(graph, topo, FlowSimulator(topo))
    assert exc.value.field == "PHANTORA_NCCL_REGISTER" and "\n" not in str(exc.value)


PROGRAM = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    x = torch.ones(1 << 20, device="cuda")  # 4 MiB
    dist.all_reduce(x)  # the run's settings
    os.environ["NCCL_PROTO"] = "LL"  # set by the program: the next group's communicator takes it
    g = dist.new_group([0, 1, 2, 3])
    dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def test_a_program_set_protocol_is_recorded_and_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live, the world's 4 MiB all-reduce takes NCCL's choice (LL128 on 4 GPUs of a testbed16 host) and the group
    created after NCCL_PROTO=LL takes LL; the replay, and the replay of its Chakra export, make the same two choices
    and end when the live run did (before, both replayed as LL128, the variable lost); a replay under the user's own
    NCCL_PROTO=Simple runs both with Simple."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    topo = load_topology("testbed16")
    rep, graph = record_run(RunConfig(str(script), [], topo, nproc=4, trace="none", timeout_s=120), tmp_path / "g")
    assert rep.summary["nccl"]["choices"]["all_reduce"] == {"Ring/LL128": 1, "Ring/LL": 1}
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, topo, FlowSimulator(topo))
        assert res.nccl == {"all_reduce": {"Ring/LL": 1, "Ring/LL128": 1}}
        assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    used = replay_graph(graph, topo, FlowSimulator(topo)).nccl["all_reduce"]
    assert sum(used.values()) == 2 and all(k.endswith("/Simple") for k in used), used
