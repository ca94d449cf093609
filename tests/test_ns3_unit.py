"""The ns-3 module's own C++ unit tests (ns3-scratch/test/, ns-3 TestSuites), run by ns-3's test runner."""

from __future__ import annotations

import subprocess

import pytest

from phantora.netsim.ns3_build import build, needs_build
from phantora.netsim.packet import library_path

pytestmark = pytest.mark.ns3


def test_cpp_test_suites_pass(ns3_lib) -> None:
    if needs_build(tests=True):  # a simulation builds the library and the runner only (make models)
        build(tests=True)
    runner = library_path().parent / "phantora-ns3-tests"
    listed = subprocess.run([str(runner), "--list"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "phantora-model" in listed
    proc = subprocess.run(
        [str(runner), "--suite=phantora-model", "--verbose"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS phantora-model" in proc.stdout and "FAIL" not in proc.stdout
    assert proc.stdout.count("  PASS ") >= 5  # every test case ran


def test_cpp_fault_suite_passes(ns3_lib) -> None:
    """The scenario code of the fabric (ns3-scratch/test/phantora-fault-test-suite.cc): re-convergence routes, a
    flow on a failed link moved with its unsent bytes, a flap with no traffic changing nothing, a NIC failover to
    the host's other NIC, a one-NIC host's flow stalled with no route until the repair, a slow GPU opened by a step
    marker's completion."""
    if needs_build(tests=True):
        build(tests=True)
    runner = library_path().parent / "phantora-ns3-tests"
    proc = subprocess.run(
        [str(runner), "--suite=phantora-faults", "--verbose"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS phantora-faults" in proc.stdout and "FAIL" not in proc.stdout
    assert proc.stdout.count("  PASS ") == 6


def test_cpp_uet_suite_passes(ns3_lib) -> None:
    """The Ultra Ethernet transport's entropy choice (ns3-scratch/test/phantora-uet-test-suite.cc): the NIC's REPS
    attributes and REPS freezing step by step (cycling the last good entropies, the thaw's explorations)."""
    if needs_build(tests=True):
        build(tests=True)
    runner = library_path().parent / "phantora-ns3-tests"
    proc = subprocess.run(
        [str(runner), "--suite=phantora-uet", "--verbose"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS phantora-uet" in proc.stdout and "FAIL" not in proc.stdout
    assert proc.stdout.count("  PASS ") == 2
