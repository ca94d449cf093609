"""Shared fixtures. `zygotes`: every live run of the session forks its fork server from a zygote kept across
runs (bridge/zygote.py; tests that need a run's own fork server unset `PHANTORA_ZYGOTE`). `ns3_lib` imports ns-3
and loads the phantora fabric library once per test session; `solver_calls` counts the flow engine's max-min
solver calls; `zmq_pair` gives a bound ROUTER and a DEALER connected to it, as a bridge server and its peer;
`charge_mode` is a rank's charge mode in the test's process (ops on the simulated GPU). The longest files are
collected first (`LONGEST_FIRST`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bridge.zygote import ZygoteHome

if TYPE_CHECKING:
    from phantora.runtime.dispatch import ChargeMode

# The files that took longest in the lead's `.ci/run` at d59f6366 with `--durations=0 --durations-min=0.3`
# (2026-12-03, zygotes on, load 4-7 on 2 cores beside a helper's runs: the sums of their tests of 0.3 s or more,
# set-up included), longest first. scripts/test.sh gives each worker a file at a time in collection order
# (--dist loadfile --no-loadscope-reorder), so the wall ends with the last files started: the long ones start first,
# the many short ones fill the gaps. Every other file keeps its place after them.
LONGEST_FIRST = (
    "test_simcuda.py",
    "test_bridge_run.py",
    "conformance/test_pytorch_examples.py",
    "frameworks/test_hf_trainer.py",
    "test_forkserver.py",
    "test_doc_figures.py",
    "frameworks/test_deepspeed.py",
    "test_bridge_ns3.py",
    "test_runtime_e2e.py",
    "frameworks/test_torchtitan.py",
    "test_handoff_streams.py",
    "test_examples_zoo.py",
    "test_sweep.py",
    "conformance/test_torchtitan_train.py",
    "test_runtime_phantom.py",
    "conformance/test_megatron_lm.py",
    "test_run_cosim.py",
    "frameworks/test_megatron_core.py",
    "test_zygote.py",
    "test_nccl_monotone.py",
    "test_eager_send.py",
    "test_egraph_live.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the files of `LONGEST_FIRST` to the front, in its order (a stable sort: tests keep their order)."""
    here = Path(__file__).parent
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(here).as_posix(), len(rank))
        except ValueError:  # a test outside tests/
            return len(rank)

    items.sort(key=key)


@pytest.fixture(scope="session", autouse=True)
def zygotes() -> Iterator[ZygoteHome]:
    """A zygote home for the session's live runs: a fork server's imports (torch: 5-6 CPU s) paid once per start-up.

    Its zygotes stay while the session (the xdist worker) lives: with the default 30 s idle a worker's ranks' zygote
    was started 45 times in one suite run (203 CPU s), whenever 30 s of tests without a live run passed. They leave
    at the session's end (`close`), or with the worker's process if it dies first (their pidfd on it)."""
    with ZygoteHome(idle_s=math.inf) as home:
        yield home


@pytest.fixture(scope="session")
def ns3_lib():
    """The loaded ns-3 runtime (phantora.netsim.packet.Ns3Runtime): `.ns`, `.cppyy`, `.gbl` (= cppyy.gbl.ns3).

    Builds ns3-scratch first if a source changed (scripts/build_ns3.sh is incremental), and declares the
    model headers (CongestionControl, Cc*) so tests can drive those classes directly. Skips the test if
    the ns3 wheel is not installed.
    """
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    from phantora.netsim.packet import load_ns3

    runtime = load_ns3()
    runtime.include_model_headers()
    return runtime


@pytest.fixture
def charge_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChargeMode]:
    """A rank's ChargeMode in this process (an H100 under the roofline, no network, no trace): `with charge_mode:`
    runs ops on the simulated GPU. simcuda counts as installed, as in a rank, but no device guard is set up."""
    from phantora.perfmodel.gpus import get_gpu
    from phantora.runtime.compute import Roofline
    from phantora.runtime.dispatch import ChargeMode
    from phantora.runtime.nonet import NoNetworkClient
    from phantora.runtime.session import RankSession
    from phantora.runtime.simcuda import device

    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank
    yield ChargeMode(RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none"))


@pytest.fixture
def solver_calls(monkeypatch) -> list[int]:
    """The number of paths of each call the flow engine makes to its max-min solver (`flow.maxmin_rates`) during
    the test, in order: a component solved in closed form makes none."""
    import phantora.netsim.flow as flow_mod

    calls: list[int] = []
    real = flow_mod.maxmin_rates

    def counted(paths, *args, **kwargs):
        calls.append(len(paths))
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(flow_mod, "maxmin_rates", counted)
    return calls


@pytest.fixture
def zmq_pair(tmp_path):
    """make(name, identity=None) -> (router, dealer): a ROUTER bound to ipc://<tmp_path>/<name> (a bridge server's
    socket) and a DEALER connected to it (its peer, under `identity` if given), neither lingering at close; every
    pair made is closed after the test."""
    import zmq

    made = []

    def make(name: str, identity: bytes | None = None):
        ctx = zmq.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp_path}/{name}"
        router.bind(endpoint)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            dealer.setsockopt(zmq.IDENTITY, identity)
        dealer.connect(endpoint)
        made.extend((dealer, router))
        return router, dealer

    yield make
    for sock in made:
        sock.close()
