"""A co-simulated packet run brings the ns-3 models up to date before it starts any process (ns3_build.ensure_built).

Built inside the network server, a rebuild after the sources changed counted against the coordinator's 180 s wait
for that server: on a loaded machine a README command failed with "the network server ... did not answer within
180 s" and no word of a build."""

from __future__ import annotations

import sys

import pytest

import bridge.run
from bridge.run import CosimRun
from phantora.errors import PhantoraError
from phantora.netsim import ns3_build
from phantora.netsim.engine_spec import EngineSpec
from phantora.topology.generators import leaf_spine


class _StopError(PhantoraError):
    pass


def _run(network: str, seen: list[int], monkeypatch: pytest.MonkeyPatch) -> CosimRun:
    run = CosimRun(
        leaf_spine(2, 1, 1), EngineSpec(network), rank_cmd=[sys.executable, "-c", "pass"], world_size=2, timeout_s=30
    )

    def ensure_built() -> None:
        seen.append(len(run.children))  # the processes started so far
        raise _StopError("stopped where the models are built")

    monkeypatch.setattr(bridge.run, "ensure_built", ensure_built)
    return run


def test_a_packet_run_builds_the_models_before_any_process_starts(monkeypatch: pytest.MonkeyPatch):
    seen: list[int] = []
    run = _run("ns3", seen, monkeypatch)
    with pytest.raises(_StopError):
        run.run()
    assert seen == [0] and run.children == []


def test_a_flow_run_does_not_look_at_the_models(monkeypatch: pytest.MonkeyPatch):
    seen: list[int] = []
    with pytest.raises(PhantoraError) as exc:  # ranks that never join: the run fails, not at the models
        _run("flow", seen, monkeypatch).run()
    assert seen == [] and not isinstance(exc.value, _StopError)


def test_ensure_built_says_so_and_builds_only_when_stale(monkeypatch: pytest.MonkeyPatch):
    built, said = [], []
    monkeypatch.delenv("PHANTORA_NS3_LIB", raising=False)
    monkeypatch.delenv(ns3_build.CC_DIR_ENV, raising=False)
    monkeypatch.setattr(ns3_build, "build", lambda jobs=2, tests=False: built.append(1))
    for stale in (False, True):
        monkeypatch.setattr(ns3_build, "needs_build", lambda tests=False, s=stale: s)
        ns3_build.ensure_built(said.append)
    assert built == [1] and len(said) == 1 and "building the ns-3 models" in said[0]
