"""Control laws of the congestion controllers (ns3-scratch/model/cc-*.cc), fed with synthetic feedback.

Each test drives one controller object directly (no network) and checks its rate against the closed form of
the published algorithm: DCQCN's timers and cuts, HPCC's utilisation estimate and window, TIMELY's gradient
rule, DCTCP's alpha EWMA and Swift's delay-target AIMD.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.ns3

G100 = 100_000_000_000
G800 = 800_000_000_000


@pytest.fixture(scope="session")
def ns3_cc(ns3_lib):
    """(ns, cppyy) with the Cc* classes declared."""
    return ns3_lib.ns, ns3_lib.cppyy


@pytest.fixture
def cc(ns3_cc):
    """A factory `make(type_name, line_bps, base_rtt_ns, mtu, bdp, **attrs)` of started controllers."""
    ns, cppyy = ns3_cc
    ns.Simulator.Destroy()
    made = []

    def make(name: str, line: int = G100, rtt: int = 8320, mtu: int = 1000, bdp: int = 104_000, **attrs: object):
        factory = ns.ObjectFactory()
        factory.SetTypeId(f"ns3::{name}")
        for key, value in attrs.items():
            factory.Set(key, ns.StringValue(str(value).lower() if isinstance(value, bool) else str(value)))
        obj = cppyy.gbl.ns3.DynamicCast[getattr(cppyy.gbl.ns3, name)](factory.Create())
        obj.Start(line, rtt, mtu, bdp)
        made.append(obj)
        return obj

    yield make
    for obj in made:
        obj.Stop()
    ns.Simulator.Destroy()


def feedback(ns3_cc, ack_seq: int, ecn: bool = False, rtt: int = 0, hops=(), now: int = 0):
    """A CcFeedback with INT hops given as (time_ns, tx_bytes, qlen_bytes, line_bps) tuples."""
    _, cppyy = ns3_cc
    fb = cppyy.gbl.ns3.CcFeedback()
    fb.nowNs = now
    fb.ackSeq = ack_seq
    fb.newlyAcked = 1000
    fb.ecnEcho = ecn
    fb.rttNs = rtt
    fb.nHops = len(hops)
    for i, (t, tx, q, bw) in enumerate(hops):
        fb.hops[i].timeNs = t
        fb.hops[i].txBytes = tx
        fb.hops[i].qlenBytes = q
        fb.hops[i].lineRateBps = bw
    return fb


def run_until(ns3_cc, t_ns: int) -> None:
    ns, _ = ns3_cc
    ns.Simulator.Stop(ns.NanoSeconds(t_ns - ns.Simulator.Now().GetNanoSeconds()))
    ns.Simulator.Run()


# ----- DCQCN --------------------------------------------------------------------------------------------


def test_dcqcn_first_cut_and_recovery_follow_the_timers(cc, ns3_cc):
    q = cc("CcDcqcn")
    assert q.GetRateBps() == G100 and q.GetWindowBytes() == 0
    q.OnAck(feedback(ns3_cc, 1000, ecn=True))
    # Alpha starts at 1 and decays at 1, 2, 3, 4 us (no CNP since); the cut lands at 4 us + 1 ns.
    run_until(ns3_cc, 4000)
    assert q.GetRateBps() == G100
    run_until(ns3_cc, 5000)
    alpha = (1 - 1 / 256) ** 4
    cut = G100 * (1 - alpha / 2)
    assert q.GetRateBps() == pytest.approx(cut, abs=2)
    assert q.GetDecreaseCount() == 1
    # Fast recovery 300 us after the cut: halfway back to the target (line rate, not clamped on stage 0).
    run_until(ns3_cc, 4001 + 300_000 - 1)
    assert q.GetRateBps() == pytest.approx(cut, abs=2)
    run_until(ns3_cc, 4001 + 300_000 + 1)
    fr = (cut + G100) / 2
    assert q.GetRateBps() == pytest.approx(fr, abs=4)
    # Next stage (== F = 1): additive increase; the target is already at line rate.
    run_until(ns3_cc, 4001 + 600_000 + 1)
    assert q.GetRateBps() == pytest.approx((fr + G100) / 2, abs=8)


def test_dcqcn_cuts_at_most_once_per_interval_and_stops_at_min_rate(cc, ns3_cc):
    q = cc("CcDcqcn")
    t = 0
    while t < 200_000:  # a CNP every 500 ns for 200 us: a cut every 4 us, never below MinRate
        q.OnAck(feedback(ns3_cc, 1000, ecn=True))
        t += 500
        run_until(ns3_cc, t)
    assert q.GetCnpCount() == 400
    assert q.GetDecreaseCount() == len(range(4001, 200_001, 4000))
    assert q.GetRateBps() == 1_000_000_000
    # With a CNP every 500 ns alpha is refreshed with g each microsecond and stays at 1.
    assert q.GetAlpha() == pytest.approx(1.0)


def test_dcqcn_cnp_interval_takes_one_cnp_per_interval(cc, ns3_cc):
    """CnpInterval 4 us (ConnectX's min_time_between_cnps): of CE echoes every 500 ns, one per 4 us is a CNP, so
    alpha gains g once per 4 us and decays between (it stays at 1 with every echo a CNP, the test above)."""
    g = 1 / 256
    q = cc("CcDcqcn", CnpInterval="4us", MinRate=1)  # no floor: nine cuts go below the default 1 Gb/s
    t = 0
    while t < 40_000:  # echoes at 0, 500, ..., 39500: CNPs taken at 0, 4000, ..., 36000
        q.OnAck(feedback(ns3_cc, 1000, ecn=True))
        t += 500
        run_until(ns3_cc, t)
    run_until(ns3_cc, 40_500)
    assert q.GetCnpCount() == 10
    # An alpha update at u (each us) runs before the echo delivered at u, so the CNP taken at 4000 k counts at
    # 4000 k + 1000; a check at 4001 + 4000 j cuts by the alpha of the update just before it.
    alpha, rate = 1.0, float(G100)
    for u in range(1000, 40_001, 1000):
        alpha = (1 - g) * alpha + (g if u >= 5000 and (u - 1000) % 4000 == 0 else 0.0)
        if u % 4000 == 0 and u <= 36_000:
            rate *= 1 - alpha / 2
    assert q.GetDecreaseCount() == 9  # the check at 40001 finds no CNP taken since 36001
    assert q.GetAlpha() == pytest.approx(alpha, rel=1e-12)
    assert q.GetRateBps() == pytest.approx(rate, abs=16)


def test_dcqcn_increase_steps_scale_with_line_rate(cc, ns3_cc):
    g = 1 / 256
    q = cc("CcDcqcn", line=G800, FastRecoveryTimes=0)
    q.OnAck(feedback(ns3_cc, 1000, ecn=True))
    run_until(ns3_cc, 304_400)  # cut at 4001 (target stays at line rate), first increase at 304001
    cut1 = G800 * (1 - (1 - g) ** 4 / 2)
    r1 = (cut1 + G800) / 2
    assert q.GetRateBps() == pytest.approx(r1, abs=2)
    q.OnAck(feedback(ns3_cc, 2000, ecn=True))  # a CNP after an increase: the next cut clamps the target
    run_until(ns3_cc, 308_500)
    alpha = 1.0
    for t in range(1000, 308_001, 1000):
        alpha = (1 - g) * alpha + (g if t == 305_000 else 0.0)
    cut2 = r1 * (1 - alpha / 2)
    assert q.GetTargetRateBps() == pytest.approx(r1, abs=2)
    assert q.GetRateBps() == pytest.approx(cut2, abs=2)
    # F = 0: the first timer event is additive, AI = 5*800/25 Mb/s = 160 Mb/s ...
    run_until(ns3_cc, 608_002)
    target = r1 + 160_000_000
    r2 = (cut2 + target) / 2
    assert q.GetTargetRateBps() == pytest.approx(target, abs=4)
    assert q.GetRateBps() == pytest.approx(r2, abs=4)
    # ... then hyper, HAI = 50*800/25 Mb/s = 1600 Mb/s.
    run_until(ns3_cc, 908_002)
    target += 1_600_000_000
    assert q.GetTargetRateBps() == pytest.approx(target, abs=8)
    assert q.GetRateBps() == pytest.approx((r2 + target) / 2, abs=8)


def test_dcqcn_byte_counter_follows_the_paper(cc, ns3_cc):
    """ByteCounter > 0 (paper: 10 MB): every B bytes sent is an increase event; fast recovery while both the
    timer and byte stages are below F, additive until both exceed F, then hyper."""
    g, mb = 1 / 256, 1_000_000
    q = cc("CcDcqcn", ByteCounter=mb, ClampTargetRate=True)
    q.OnAck(feedback(ns3_cc, 1000, ecn=True))
    run_until(ns3_cc, 4500)  # cut 1 at 4001: target = line rate (clamped), rate cut
    q.OnAck(feedback(ns3_cc, 2000, ecn=True))
    run_until(ns3_cc, 8500)  # cut 2 at 8001: target = rate after cut 1
    alpha1 = (1 - g) ** 4
    cut1 = G100 * (1 - alpha1 / 2)
    alpha2 = alpha1
    for t in range(5000, 8001, 1000):
        alpha2 = (1 - g) * alpha2 + (g if t == 5000 else 0.0)
    rate = cut1 * (1 - alpha2 / 2)
    target = cut1
    assert q.GetTargetRateBps() == pytest.approx(target, abs=2)
    assert q.GetRateBps() == pytest.approx(rate, abs=2)
    steps = []
    for _ in range(4):  # four byte-counter events, no timer event (the RP timer is 300 us away)
        for _ in range(10):
            q.OnSend(100_000, 0)
        steps.append(q.GetTargetRateBps())
    rate = (rate + target) / 2  # BC stage 0 < F = 1: fast recovery, target unchanged
    assert steps[0] == pytest.approx(target, abs=2)
    for i in range(1, 4):  # BC >= F but the timer stage is 0: additive increase (20 Mb/s at 100G)
        target += 20_000_000
        rate = (rate + target) / 2
        assert steps[i] == pytest.approx(target, abs=4)
    assert q.GetRateBps() == pytest.approx(rate, abs=8)
    run_until(ns3_cc, 8001 + 300_001)  # timer stage 0: max(T, BC) >= F, min = 0: additive
    run_until(ns3_cc, 8001 + 600_001)  # timer stage 1: min(T, BC) = 1, not above F: additive
    target += 40_000_000
    assert q.GetTargetRateBps() == pytest.approx(target, abs=8)
    run_until(ns3_cc, 8001 + 900_001)  # timer stage 2 and byte stage 4, both above F: hyper (200 Mb/s)
    target += 200_000_000
    assert q.GetTargetRateBps() == pytest.approx(target, abs=8)


def test_dcqcn_clamps_the_target_only_after_a_timer_increase(cc, ns3_cc):
    """ClampTargetRate off (ConnectX: clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1): a cut keeps the target
    after byte-counter increases alone, and takes the current rate as the target once the timer has raised it."""
    g, mb = 1 / 256, 1_000_000
    q = cc("CcDcqcn", ByteCounter=mb)
    q.OnAck(feedback(ns3_cc, 1000, ecn=True))
    run_until(ns3_cc, 4500)  # cut 1 at 4001, no increase before it: the target stays at the line rate
    cut1 = G100 * (1 - (1 - g) ** 4 / 2)
    assert q.GetTargetRateBps() == G100
    assert q.GetRateBps() == pytest.approx(cut1, abs=2)
    for _ in range(20):  # two byte-counter events: fast recovery (stage 0 < F), then additive (target capped)
        q.OnSend(100_000, 0)
    rate = ((cut1 + G100) / 2 + G100) / 2
    assert q.GetRateBps() == pytest.approx(rate, abs=4)
    q.OnAck(feedback(ns3_cc, 2000, ecn=True))
    run_until(ns3_cc, 8500)  # cut 2 at 8001 after byte-counter increases only: the target is not clamped
    alpha2 = (1 - g) ** 4
    for t in range(5000, 8001, 1000):
        alpha2 = (1 - g) * alpha2 + (g if t == 5000 else 0.0)
    rate *= 1 - alpha2 / 2
    assert q.GetTargetRateBps() == G100
    assert q.GetRateBps() == pytest.approx(rate, abs=4)
    run_until(ns3_cc, 8001 + 300_001)  # a timer increase (byte stage 0 after the cut: fast recovery) ...
    rate = (rate + G100) / 2
    assert q.GetRateBps() == pytest.approx(rate, abs=8)
    q.OnAck(feedback(ns3_cc, 3000, ecn=True))
    run_until(ns3_cc, 8001 + 304_000 + 500)  # ... so cut 3 (at 312001) takes the current rate as its target
    assert q.GetTargetRateBps() == pytest.approx(rate, abs=8)
    assert q.GetDecreaseCount() == 3


# ----- HPCC ---------------------------------------------------------------------------------------------


def _hpcc_two_acks(cc, ns3_cc, line: int, rtt: int, bdp: int, base_tx: int, util: float, qlen: int):
    """First ACK stores the INT; the second closes the round one base RTT later with utilisation `util`."""
    h = cc("CcHpcc", line=line, rtt=rtt, bdp=bdp)
    for _ in range(10):
        h.OnSend(1000, 0)
    h.OnAck(feedback(ns3_cc, 1000, hops=[(1000, base_tx, qlen, line)]))
    sent = int(util * line * rtt / 8e9)
    h.OnSend(1000, 0)
    h.OnAck(feedback(ns3_cc, 11_000, hops=[(1000 + rtt, base_tx + sent, qlen, line)]))
    return h


@pytest.mark.parametrize("line", [G100, 400_000_000_000, G800])
def test_hpcc_full_update_is_the_published_formula(cc, ns3_cc, line):
    rtt = 8320
    bdp = line * rtt // 8_000_000_000
    qlen = bdp // 2
    # Counters far beyond 32 bits, as a port at 800G reaches within a second.
    h = _hpcc_two_acks(cc, ns3_cc, line, rtt, bdp, base_tx=3 << 40, util=1.0, qlen=qlen)
    u = 1.0 + qlen / bdp  # tx rate / line rate + queue / BDP, the whole round (dt = T)
    want = line / (u / 0.95) + line / 2500  # W = W / (U / eta) + W_ai, as a rate; AI = 10*bw/25 Mb/s
    assert h.GetUtilisation() == pytest.approx(u, rel=1e-9)
    assert h.GetRateBps() == pytest.approx(want, rel=1e-9)
    assert h.GetReferenceRateBps() == h.GetRateBps()
    assert h.GetWindowBytes() == pytest.approx(bdp * want / line, abs=1)


def test_hpcc_grows_when_underused_and_takes_the_busiest_hop(cc, ns3_cc):
    line, rtt, bdp = G100, 8320, 104_000
    h = cc("CcHpcc")
    for _ in range(10):
        h.OnSend(1000, 0)
    h.OnAck(feedback(ns3_cc, 1000, hops=[(0, 0, 0, line), (10, 0, 0, line)]))
    h.OnSend(1000, 0)
    # Hop 0 runs at 40% of line rate, hop 1 at 60% with a 10 KB standing queue (min of both samples).
    b0, b1 = int(0.4 * line * rtt / 8e9), int(0.6 * line * rtt / 8e9)
    h.OnAck(feedback(ns3_cc, 11_000, hops=[(rtt, b0, 5000, line), (10 + rtt, b1, 10_000, line)]))
    u = 0.6 + 0.0  # min(qlen now, qlen before) = 0 on hop 1
    assert h.GetUtilisation() == pytest.approx(u, rel=1e-9)
    assert h.GetRateBps() == G100  # 100G / (0.6 / 0.95) + AI exceeds line rate: capped
    assert h.GetWindowBytes() == bdp


def test_hpcc_fast_react_uses_the_reference_rate(cc, ns3_cc):
    line, rtt, bdp = G100, 8320, 104_000
    h = _hpcc_two_acks(cc, ns3_cc, line, rtt, bdp, base_tx=0, util=1.0, qlen=52_000)
    ref = h.GetReferenceRateBps()
    u1 = h.GetUtilisation()
    sent = int(1.0 * line * rtt / 8e9)
    # An ACK inside the round (seq <= last update seq), 100 ns later, 1250 bytes more, queue unchanged.
    h.OnAck(feedback(ns3_cc, 11_000, hops=[(1000 + rtt + 100, sent + 625, 52_000, line)]))
    u_new = 625 * 8e9 / 100 / line + 52_000 / bdp  # half the line rate over those 100 ns
    u2 = (u1 * (rtt - 100) + u_new * 100) / rtt
    assert h.GetUtilisation() == pytest.approx(u2, rel=1e-9)
    assert h.GetRateBps() == pytest.approx(ref / (u2 / 0.95) + line / 2500, rel=1e-9)
    assert h.GetReferenceRateBps() == ref  # fast react does not commit
    assert h.WantsInt()


def test_hpcc_normalises_each_hop_by_its_own_rate(cc, ns3_cc):
    """A 400G NIC through an 800G hop (testbed16's spine links): u = tx / hop rate + qlen * line / hop / BDP."""
    line, hop, rtt = 400_000_000_000, G800, 8000
    bdp = line * rtt // 8_000_000_000  # 400,000 B
    h = cc("CcHpcc", line=line, rtt=rtt, bdp=bdp)
    h.OnSend(1000, 0)
    h.OnAck(feedback(ns3_cc, 1000, hops=[(0, 0, 0, line), (0, 0, 200_000, hop)]))
    h.OnSend(1000, 0)
    # The 400G hop at 50%; the 800G hop at 90% of its rate with 200 KB queued: 0.9 + 200 KB / the hop's BDP.
    h.OnAck(feedback(ns3_cc, 2000, hops=[(rtt, 250_000, 0, line), (rtt, 720_000, 200_000, hop)]))
    u = 0.9 + 200_000 * line / hop / bdp  # 1.15: the 800G hop, its queue worth a quarter of its own BDP
    assert h.GetUtilisation() == pytest.approx(u, rel=1e-12)
    assert h.GetRateBps() == pytest.approx(line / (u / 0.95) + line / 2500, abs=1)
    assert h.GetWindowBytes() == pytest.approx(bdp * h.GetRateBps() / line, abs=1)


@pytest.mark.parametrize("rai", [0, 16_000_000_000])
def test_hpcc_gap_between_two_senders_decays_as_the_closed_form(cc, ns3_cc, rai):
    """Two 800G senders on one 800G link, its utilisation their rates' sum over its rate (no queue): each round
    R_i <- R_i eta / U + W_ai, so the sum settles at eta C + 2 W_ai and the gap shrinks by eta C / (eta C + 2 W_ai)
    a round: 0.08% with the default W_ai (line rate / 2500), the rates' ratio held for hundreds of rounds."""
    line = hop = G800
    rtt = 8000
    bdp = line * rtt // 8_000_000_000
    a, b = (cc("CcHpcc", line=line, rtt=rtt, bdp=bdp, RateAi=rai) for _ in range(2))
    ai = rai or line / 2500
    sent = {id(a): 0, id(b): 0}  # the hop's byte counter as each sender's INT saw it
    t = 0
    for h in (a, b):
        h.OnSend(1000, 0)
        h.OnAck(feedback(ns3_cc, 1000, hops=[(0, 0, 0, hop)]))

    def round_(util_a: float, util_b: float) -> None:
        nonlocal t
        t += rtt
        for h, util in ((a, util_a), (b, util_b)):
            sent[id(h)] += round(util * hop * rtt / 8e9)
            h.OnSend(1000, 0)
            h.OnAck(feedback(ns3_cc, 1000 * (t // rtt + 1), hops=[(t, sent[id(h)], 0, hop)]))

    round_(1.0, 2.0)  # b alone saw a transient at twice the link's rate: 0.95 line + W_ai against 0.475 line + W_ai
    gap = a.GetRateBps() - b.GetRateBps()
    assert gap == pytest.approx(0.475 * line, rel=1e-9)
    eta_c = 0.95 * hop
    for _ in range(40):
        total = a.GetRateBps() + b.GetRateBps()
        round_(total / hop, total / hop)
        gap *= eta_c / total  # both scaled by eta C / their sum, then the same W_ai added to each
        assert a.GetRateBps() + b.GetRateBps() == pytest.approx(eta_c + 2 * ai, rel=1e-6)
        assert a.GetRateBps() - b.GetRateBps() == pytest.approx(gap, rel=1e-6)
    # from the second round on the sum is eta C + 2 W_ai: the gap's factor a round is eta C / (eta C + 2 W_ai)
    want = 0.475 * line * eta_c / (0.95 * line + 0.475 * line + 2 * ai) * (eta_c / (eta_c + 2 * ai)) ** 39
    assert a.GetRateBps() - b.GetRateBps() == pytest.approx(want, rel=1e-5)


# ----- TIMELY -------------------------------------------------------------------------------------------


def test_timely_rules(cc, ns3_cc):
    t = cc("CcTimely")
    assert t.GetWindowBytes() == 0
    sent = 0

    def ack(rtt: int) -> None:
        nonlocal sent
        sent += 1000
        t.OnSend(1000, 0)
        t.OnAck(feedback(ns3_cc, sent, rtt=rtt))

    ack(10_000)  # first RTT sample: no decision
    assert t.GetRateBps() == G100
    ack(600_000)  # above T_high: cut by beta * (1 - T_high / rtt)
    r1 = G100 * (1 - 0.8 * (1 - 500_000 / 600_000))
    assert t.GetRateBps() == pytest.approx(r1, abs=1)
    ack(40_000)  # below T_low: additive increase (5*bw/25 Mb/s = 20 Mb/s at 100G)
    r2 = r1 + 20_000_000
    assert t.GetRateBps() == pytest.approx(r2, abs=2)
    # Between the thresholds with a rising RTT: cut by beta * smoothed gradient / MinRtt.
    diff1 = 0.875 * (600_000 - 10_000)
    diff2 = 0.125 * diff1 + 0.875 * (40_000 - 600_000)
    diff3 = 0.125 * diff2 + 0.875 * (106_500 - 40_000)
    assert diff3 > 0
    ack(106_500)
    r3 = r2 * max(0.0, 1 - 0.8 * diff3 / 20_000)
    assert 0.5 < r3 / r2 < 0.9
    assert t.GetRateBps() == pytest.approx(r3, abs=2)


def test_timely_hyper_increase_after_n_rounds(cc, ns3_cc):
    t = cc("CcTimely", MinRate=1_000_000_000)
    sent = 0
    rates = []
    for rtt in [10_000, 600_000, 600_000] + [20_000] * 8:
        sent += 1000
        t.OnSend(1000, 0)
        t.OnAck(feedback(ns3_cc, sent, rtt=rtt))
        rates.append(t.GetRateBps())
    steps = [b - a for a, b in zip(rates[2:], rates[3:], strict=False)]
    # Five additive steps (20 Mb/s), then hyper steps (200 Mb/s).
    assert steps[:5] == pytest.approx([20_000_000] * 5, abs=2)
    assert steps[5:] == pytest.approx([200_000_000] * 3, abs=2)


# ----- DCTCP --------------------------------------------------------------------------------------------


def test_dctcp_cuts_once_per_window_and_tracks_alpha(cc, ns3_cc):
    d = cc("CcDctcp")
    assert d.GetWindowBytes() == 104_000  # window on, one BDP
    for _ in range(10):
        d.OnSend(1000, 0)
    d.OnAck(feedback(ns3_cc, 1000))  # opens the first batch (11 packets); additive increase capped at line rate
    assert d.GetRateBps() == G100
    d.OnAck(feedback(ns3_cc, 2000, ecn=True))  # first mark: cut with alpha = 1
    assert d.GetRateBps() == G100 // 2
    d.OnAck(feedback(ns3_cc, 3000, ecn=True))  # same round: no second cut
    d.OnAck(feedback(ns3_cc, 4000, ecn=True))
    assert d.GetRateBps() == G100 // 2
    for _ in range(10):
        d.OnSend(1000, 0)
    # The ACK that passes the round end (10 000 B): alpha folds in 3 marks of 11 packets; CWR ends;
    # no mark on this ACK, so the rate grows by 615 Mb/s.
    d.OnAck(feedback(ns3_cc, 11_000))
    alpha = (1 - 1 / 16) * 1.0 + (1 / 16) * (3 / 11)
    assert d.GetAlpha() == pytest.approx(alpha, rel=1e-12)
    assert d.GetRateBps() == G100 // 2 + 615_000_000
    d.OnAck(feedback(ns3_cc, 12_000, ecn=True))  # new round: cut by (1 - alpha / 2)
    assert d.GetRateBps() == pytest.approx((G100 // 2 + 615_000_000) * (1 - alpha / 2), abs=1)


# ----- the registry that checks --cc and --set cc.X before a run ----------------------------------------------
def test_the_registry_is_what_the_typeids_say(ns3_cc) -> None:
    """cc_registry (the runner's --list-cc) names each registered CC's TypeId and exactly its attributes."""
    from phantora.netsim.cc_registry import registry

    ns, _ = ns3_cc
    known = registry()
    assert {"none", "dcqcn", "hpcc", "timely", "dctcp", "swift"} <= set(known)
    for cc, info in known.items():
        tid = ns.TypeId.LookupByName(info.typeid)
        own = {
            str(tid.GetAttribute(i).name): str(tid.GetAttribute(i).checker.GetValueTypeName())
            for i in range(tid.GetAttributeN())
        }
        assert {name: a.kind for name, a in info.attributes.items()} == own, cc
    assert [c for c, info in known.items() if info.wants_int] == ["hpcc"]


def test_fabric_attribute_table_matches_the_typeids(ns3_cc) -> None:
    """Every path of NS3_ATTRIBUTES (packet_config.py) is an attribute of the object it names."""
    from phantora.netsim.packet_config import NS3_ATTRIBUTES

    ns, _ = ns3_cc
    owners = {"nic": "ns3::RdmaNic", "switch": "ns3::PfcSwitch", "fabric": "ns3::PhantoraFabric"}
    owners["recorder"] = "ns3::FabricRecorder"
    info = ns.TypeId.AttributeInformation()
    for paths, _ in NS3_ATTRIBUTES.values():
        for path in paths:
            scope, name = path.split(".")
            assert ns.TypeId.LookupByName(owners[scope]).LookupAttributeByName(name, info), path


# ----- Swift (cc-swift.cc, a one-file CC without a header: driven through the CongestionControl base) ------------
def swift(ns3_cc, **attrs: object):
    """A started CcSwift at 100 Gb/s, base RTT 8320 ns, 1000-byte packets, as its CongestionControl base."""
    ns, cppyy = ns3_cc
    factory = ns.ObjectFactory()
    factory.SetTypeId("ns3::CcSwift")
    for key, value in attrs.items():
        factory.Set(key, ns.StringValue(str(value)))
    obj = cppyy.gbl.ns3.DynamicCast[cppyy.gbl.ns3.CongestionControl](factory.Create())
    obj.Start(G100, 8320, 1000, 104_000)
    return obj


def swift_target_ns(cwnd: float, base_rtt: int = 8320, base_target: int = 5000) -> float:
    """Section 3.5: base RTT + BaseTarget + clamp(alpha / sqrt(cwnd) + beta, 0, 5 BaseTarget)."""
    fs_range = 5 * base_target
    alpha = fs_range / (1 / 0.1**0.5 - 1 / 100**0.5)
    return base_rtt + base_target + min(max(alpha / cwnd**0.5 - alpha / 100**0.5, 0.0), fs_range)


def test_swift_decreases_once_per_rtt_bounded_by_max_mdf_and_adds_ai_per_window(ns3_cc) -> None:
    s = swift(ns3_cc)
    cwnd = G100 * (8320 + 5000) / 8e9 / 1000  # MaxCwnd 0: line rate x (base RTT + BaseTarget), the start
    assert s.GetWindowBytes() == math.ceil(cwnd * 1000) and s.GetRateBps() == G100
    delay = round(2 * swift_target_ns(cwnd))  # twice the target: cut by beta (delay - target) / delay
    s.OnAck(feedback(ns3_cc, 1000, rtt=delay, now=100_000))
    cwnd *= max(1 - 0.8 * (delay - swift_target_ns(cwnd)) / delay, 0.5)
    assert s.GetWindowBytes() == math.ceil(cwnd * 1000)
    s.OnAck(feedback(ns3_cc, 2000, rtt=delay, now=100_000 + delay - 1))  # within one RTT of the cut: no cut
    assert s.GetWindowBytes() == math.ceil(cwnd * 1000)
    s.OnAck(feedback(ns3_cc, 3000, rtt=100 * delay, now=100_000 + 101 * delay))  # far above: max_mdf caps it
    cwnd *= 0.5
    assert s.GetWindowBytes() == math.ceil(cwnd * 1000)
    s.OnAck(feedback(ns3_cc, 4000, rtt=9000, now=200_000_000))  # below the target: + ai / cwnd per packet
    cwnd += 1 / cwnd
    assert s.GetWindowBytes() == math.ceil(cwnd * 1000)


def test_swift_paces_one_packet_per_rtt_over_cwnd_below_one_packet(ns3_cc) -> None:
    s = swift(ns3_cc, InitCwnd=0.25)
    assert s.GetWindowBytes() == 1000  # one packet in flight at most
    assert s.GetRateBps() == int(0.25 * 1000 * 8e9 / 8320)  # a packet every base RTT / 0.25
    s.OnAck(feedback(ns3_cc, 1000, rtt=12_000, now=50_000))  # below the target: + ai per packet (cwnd < 1)
    assert s.GetWindowBytes() == 1250 and s.GetRateBps() == G100  # cwnd 1.25: the window alone limits
