"""Shared fixtures. `ns3_lib` imports ns-3 and loads the phantora fabric library once per test session;
`solver_calls` counts the flow engine's max-min solver calls."""

from __future__ import annotations

import pytest


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
