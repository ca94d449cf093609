"""NCCL_* variables a program sets in os.environ before it creates a process group take effect, as NCCL reads them
when it creates the communicator (tuning.cc `ncclTopoTuneModel` reads NCCL_ALGO / NCCL_PROTO through `ncclGetEnv`;
param.cc `ncclLoadParam` the integer ones at first use; v2.30.7-1). Before, a run kept the variables it started with
and the program's were silently ignored (8 H100s, 16 MiB all-reduce with NCCL_ALGO=Ring NCCL_PROTO=Simple set by the
script: NVLS/Simple ran)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from phantora.collectives.nccl import summarize_choices
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.runtime.program_env import program_nccl_env
from phantora.topology import dgx_host
from tests.test_bridge_core import Harness

KiB, MiB = 1 << 10, 1 << 20


def _protocol(env: list[list[str]] | None) -> tuple[str, dict]:
    h = Harness()
    for r in range(4):
        h.msg(r, "coll", 0, h=1, group=[0, 1, 2, 3], seq=0, kind="all_reduce", nbytes=64 * KiB, dtype="bf16",
              root=None, name="", algo=None if env is None else {"nccl_env": env})  # fmt: skip
        h.wait(r, 0, 1)
    h.core.progress()
    rec = h.core.records[0].to_dict()
    return rec["nccl"]["protocol"], rec


def test_a_groups_own_variables_choose_for_its_collectives() -> None:
    default, rec = _protocol(None)
    forced, forced_rec = _protocol([["NCCL_PROTO", "Simple"]])
    assert default != "Simple" and forced == "Simple"
    assert "nccl_env" not in rec and forced_rec["nccl_env"] == {"NCCL_PROTO": "Simple"}
    assert summarize_choices([forced_rec], ())["program_env"] == [{"NCCL_PROTO": "Simple"}]


def test_only_a_change_since_the_start_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    start = program_nccl_env(())
    assert start == (("NCCL_ALGO", "Ring"),)
    assert program_nccl_env(start) is None
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    assert program_nccl_env(start) == (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple"))


SCRIPT = """
    import os
    os.environ["NCCL_ALGO"] = "Ring"
    os.environ["NCCL_PROTO"] = "Simple"
    os.environ["NCCL_MAX_P2P_NCHANNELS"] = "1"
    import torch, torch.distributed as dist
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    r, n = dist.get_rank(), dist.get_world_size()
    x, y = torch.empty(MiB // 4, device="cuda"), torch.empty(MiB // 4, device="cuda")
    def sendrecv():
        ops = [dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, y, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    for name, call in (("all_reduce", lambda: dist.all_reduce(x)), ("sendrecv", sendrecv)):
        call()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(4):
            call()
        e.record()
        torch.cuda.synchronize()
        if r == 0:
            print(name, round(s.elapsed_time(e) * 1000 / 4, 3))
"""


@pytest.mark.slow
def test_a_script_setting_nccl_variables_runs_as_nccl_tests_under_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's variables, exported instead to `phantora nccl-tests`, give the same choice and GPU time
    (nccl-tests' time less its first launch, 4.26 us + 32 ns a channel, over the 4 iterations)."""
    script = tmp_path / "env_script.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("MiB", str(MiB)))
    topo = dgx_host(8, gpu="h100")
    rep = launch(RunConfig(str(script), [], topo, nproc=8, tensors="phantom", out_dir=tmp_path / "run", timeout_s=600))
    times = dict(re.findall(r"^(\w+) ([0-9.]+)$", rep.logs["rank 0"], re.M))
    nccl = json.loads((tmp_path / "run" / "results.json").read_text())["nccl"]
    assert nccl["choices"]["all_reduce"] == {"Ring/Simple": 5}
    assert nccl["program_env"] == [{"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MAX_P2P_NCHANNELS": "1"}]
    for k, v in (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple"), ("NCCL_MAX_P2P_NCHANNELS", "1")):
        monkeypatch.setenv(k, v)
    for name, test in (("all_reduce", "all_reduce_perf"), ("sendrecv", "sendrecv_perf")):
        bench = nt.Bench(nt.TESTS[test], topo, tuple(range(8)), "float", iters=4, warmup=1)
        sim = make_engine(EngineSpec(), topo)
        try:
            res = nt.bench_size(bench, sim, MiB)
        finally:
            sim.close()
        assert res.choice["protocol"] == "Simple"
        if name == "sendrecv":
            assert res.choice["channels"] == 1
        launch_ns = 4260 + 32 * res.choice["channels"]
        assert float(times[name]) == pytest.approx((res.time_ns - launch_ns / 4) / 1e3, abs=0.002), name


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_send_and_recv_with_different_variables_is_a_mismatch(order: tuple[int, int]) -> None:
    """Only the sender's group set NCCL_NCHANNELS_PER_NET_PEER=8 (2 channels for this pair instead of 1): the pair
    ran on whichever end reached the coordinator first, so its time hung on message order (5,395,110 ns sender
    first, 5,393,110 receiver first). Both ends must agree, as a collective's members must: a mismatch either way."""
    from bridge.errors import RunFailed
    from bridge.protocol import E_MISMATCH

    h = Harness()
    env = {"algo": {"nccl_env": [["NCCL_NCHANNELS_PER_NET_PEER", "8"]]}}
    with pytest.raises(RunFailed, match=r"send and recv algorithm options differ") as err:
        for r in order:
            h.msg(r, "p2p", 0, h=1, peer=1 - r, send=r == 0, tag=0, seq=0, nbytes=64 * MiB, name="",
                  **(env if r == 0 else {}))  # fmt: skip
    assert err.value.code == E_MISMATCH
