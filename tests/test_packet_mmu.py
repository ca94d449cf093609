"""The switch MMU (ns3-scratch/model/switch-mmu.cc) against the dynamic-threshold rules of REFERENCE.md 5."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ns3

BUF, RESERVE, HDRM, PORTS, SHIFT, RESUME = 1_000_000, 1000, 10_000, 2, 3, 3072
PKT = 1000


@pytest.fixture
def mmu(ns3_lib):
    ns3_lib.cppyy.include("switch-mmu.h")
    m = ns3_lib.gbl.SwitchMmu()
    cfg = ns3_lib.gbl.SwitchMmu.Config()
    cfg.bufferBytes, cfg.reserveBytes, cfg.resumeOffsetBytes, cfg.shift = BUF, RESERVE, RESUME, SHIFT
    cfg.pfc, cfg.unlimited = True, False
    m.Configure(PORTS, cfg)
    for p in range(PORTS):
        m.SetHeadroom(p, HDRM)
    return m


def threshold(shared: int) -> int:
    return (BUF - PORTS * HDRM - PORTS * RESERVE - shared) >> SHIFT


def test_xoff_at_the_dynamic_threshold_then_headroom_then_drop(mmu) -> None:
    # A packet goes to the shared pool while shared + packet <= (B - H - R - shared) >> 3; the first one past
    # that goes to the port's headroom, and the class must be paused.
    added = 0
    while not mmu.ShouldPause(0, 3):
        assert mmu.Admit(0, 3, PKT)
        mmu.Add(0, 3, PKT)
        added += PKT
    shared = mmu.SharedUsed(0, 3)
    assert mmu.HeadroomUsed(0, 3) == PKT and shared == added - RESERVE - PKT
    assert shared + PKT > threshold(shared) and shared <= threshold(shared - PKT)
    assert mmu.Threshold() == threshold(shared)
    mmu.SetPaused(0, 3, True)
    # Past the threshold, packets land in this port's headroom, until it is full.
    for _ in range(HDRM // PKT - 1):
        assert mmu.Admit(0, 3, PKT)
        mmu.Add(0, 3, PKT)
    assert mmu.HeadroomUsed(0, 3) == HDRM
    assert not mmu.Admit(0, 3, PKT)
    # Another port's class is unaffected: it still has its reserve.
    assert mmu.Admit(1, 3, PKT) and not mmu.ShouldPause(1, 3)


def test_xon_needs_empty_headroom_and_the_resume_offset(mmu) -> None:
    while not mmu.ShouldPause(0, 3):
        mmu.Add(0, 3, PKT)
    mmu.SetPaused(0, 3, True)
    assert mmu.HeadroomUsed(0, 3) == PKT  # the packet that crossed the threshold
    assert not mmu.ShouldResume(0, 3)
    drained = 0
    while not mmu.ShouldResume(0, 3):
        mmu.Remove(0, 3, PKT)
        drained += PKT
    shared = mmu.SharedUsed(0, 3)
    assert mmu.HeadroomUsed(0, 3) == 0
    assert shared + RESUME <= threshold(shared) and shared + PKT + RESUME > threshold(shared + PKT)


def test_without_pfc_the_threshold_drops(ns3_lib) -> None:
    ns3_lib.cppyy.include("switch-mmu.h")
    m = ns3_lib.gbl.SwitchMmu()
    cfg = ns3_lib.gbl.SwitchMmu.Config()
    cfg.bufferBytes, cfg.reserveBytes, cfg.shift, cfg.pfc = BUF, RESERVE, SHIFT, False
    m.Configure(PORTS, cfg)
    m.SetHeadroom(0, HDRM)  # ignored without PFC
    stored = 0
    while m.Admit(0, 3, PKT):
        m.Add(0, 3, PKT)
        stored += PKT
    shared = stored - RESERVE
    # No headroom: the class stops at the threshold, (B - R - s) >> 3.
    assert shared + PKT > (BUF - PORTS * RESERVE - shared) >> SHIFT
    assert not m.ShouldPause(0, 3)
