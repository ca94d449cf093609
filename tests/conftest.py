"""Shared fixtures. `ns3_lib` imports ns-3 and loads the phantora fabric library once per test session."""

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
