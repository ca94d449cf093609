"""The ns-3 module's own C++ unit tests (ns3-scratch/test/, ns-3 TestSuites), run by ns-3's test runner."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from phantora.netsim.ns3_build import build, needs_build
from phantora.netsim.packet import library_path

pytestmark = pytest.mark.ns3


def _runner() -> Path:
    """ns-3's test runner over our TestSuites (a simulation builds the library and the runner only: make models)."""
    if needs_build(tests=True):
        build(tests=True)
    return library_path().parent / "phantora-ns3-tests"


def _passing_cases(suite: str) -> int:
    """Run one TestSuite; assert it passed whole; the number of its test cases that passed."""
    proc = subprocess.run(
        [str(_runner()), f"--suite={suite}", "--verbose"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"PASS {suite}" in proc.stdout and "FAIL" not in proc.stdout
    return proc.stdout.count("  PASS ")


def test_cpp_test_suites_pass(ns3_lib) -> None:
    listed = subprocess.run([str(_runner()), "--list"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "phantora-model" in listed
    assert _passing_cases("phantora-model") >= 5  # every test case ran


def test_cpp_fault_suite_passes(ns3_lib) -> None:
    """The scenario code of the fabric (ns3-scratch/test/phantora-fault-test-suite.cc): re-convergence routes, a
    flow on a failed link moved with its unsent bytes, a flap with no traffic changing nothing, a NIC failover to
    the host's other NIC, a one-NIC host's flow stalled with no route until the repair, a slow GPU opened by a step
    marker's completion."""
    assert _passing_cases("phantora-faults") == 6


def test_cpp_uet_suite_passes(ns3_lib) -> None:
    """The Ultra Ethernet transport's entropy choice (ns3-scratch/test/phantora-uet-test-suite.cc): the NIC's REPS
    attributes and REPS freezing step by step (cycling the last good entropies, the thaw's explorations)."""
    assert _passing_cases("phantora-uet") == 2


def test_cpp_keyed_suite_passes(ns3_lib) -> None:
    """The keyed scheduler mode (ns3-scratch/test/phantora-keyed-test-suite.cc): the keyed scheduler's order is
    the sorted order of the full keys whatever the insertion order, with near, far, put-back and removed events;
    a simulator run's trace (events queued with explicit keys in three orders, and the events they schedule) is
    the same each time and follows the rule; IsPending answers by what has run; a queue sample's key orders after
    every other key of its ns (the caller's counts stop below the samples'), the samplers by slot; LeastReach (a
    partition worker's earliest output, df2d55c) equals a brute-force minimum over the pending events; both the
    order and LeastReach hold with a third of the events queued in staged batches (a worker's cut-cable arrivals)."""
    assert _passing_cases("phantora-keyed") == 7
