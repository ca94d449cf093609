// DCQCN reaction point: see cc-dcqcn.h.
#include "cc-dcqcn.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/simulator.h"
#include "ns3/uinteger.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCcDcqcn");
PHANTORA_REGISTER_CC(CcDcqcn, "dcqcn");

TypeId CcDcqcn::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcDcqcn, CongestionControl>("ns3::CcDcqcn")
          .AddAttribute("G", "Alpha EWMA gain g", DoubleValue(1.0 / 256), MakeDoubleAccessor(&CcDcqcn::m_g),
                        MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("AlphaResumeInterval", "Period of the alpha update", TimeValue(MicroSeconds(1)),
                        MakeTimeAccessor(&CcDcqcn::m_alphaResumeInterval), MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("RateDecreaseInterval", "Minimum time between two rate cuts", TimeValue(MicroSeconds(4)),
                        MakeTimeAccessor(&CcDcqcn::m_rateDecreaseInterval), MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("RpTimer", "Rate-increase timer period", TimeValue(MicroSeconds(300)),
                        MakeTimeAccessor(&CcDcqcn::m_rpTimer), MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("FastRecoveryTimes", "Fast-recovery stages before additive increase (F)", UintegerValue(1),
                        MakeUintegerAccessor(&CcDcqcn::m_fastRecoveryTimes), MakeUintegerChecker<uint32_t>())
          .AddAttribute("RateAi", "Additive increase step in bit/s; 0 = 5*bw/25 Mb/s (bw in Gb/s)", UintegerValue(0),
                        MakeUintegerAccessor(&CcDcqcn::m_raiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("RateHai", "Hyper increase step in bit/s; 0 = 50*bw/25 Mb/s", UintegerValue(0),
                        MakeUintegerAccessor(&CcDcqcn::m_rhaiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("MinRate", "Lowest pacing rate in bit/s", UintegerValue(1000000000ULL),
                        MakeUintegerAccessor(&CcDcqcn::m_minRateBps), MakeUintegerChecker<uint64_t>(1))
          .AddAttribute("RateOnFirstCnp", "Fraction of the current rate kept on the first CNP", DoubleValue(1.0),
                        MakeDoubleAccessor(&CcDcqcn::m_rateOnFirstCnp), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("ClampTargetRate", "Always set the target rate to the current rate on a cut",
                        BooleanValue(false), MakeBooleanAccessor(&CcDcqcn::m_clampTargetRate),
                        MakeBooleanChecker())
          .AddAttribute("CnpInterval",
                        "CNPs taken at most once per this interval, the later ones ignored (a notification "
                        "point's CNP pacing, ConnectX min_time_between_cnps: 4 us); 0 = every CE echo is a CNP",
                        TimeValue(NanoSeconds(0)), MakeTimeAccessor(&CcDcqcn::m_cnpInterval),
                        MakeTimeChecker(NanoSeconds(0)))
          .AddAttribute("ByteCounter", "Bytes sent per byte-counter increase event; 0 = timer only (paper: 10 MB)",
                        UintegerValue(0), MakeUintegerAccessor(&CcDcqcn::m_byteCounter),
                        MakeUintegerChecker<uint64_t>());
  return tid;
}

void CcDcqcn::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  // Published steps at 100 Gb/s are 20 / 200 Mb/s: 5*bw/25 and 50*bw/25 Mb/s with bw in Gb/s.
  if (m_raiBps == 0) {
    m_raiBps = lineRateBps / 5000;
  }
  if (m_rhaiBps == 0) {
    m_rhaiBps = lineRateBps / 500;
  }
  m_targetRateBps = lineRateBps;
  m_windowBytes = 0;
}

void CcDcqcn::OnAck(const CcFeedback& fb) {
  if (fb.ecnEcho) {
    OnCnp();
  }
}

void CcDcqcn::OnCnp() {
  const int64_t now = Simulator::Now().GetNanoSeconds();
  if (m_lastCnpNs >= 0 && now - m_lastCnpNs < m_cnpInterval.GetNanoSeconds()) {
    return;  // paced out, as the receiver would not have sent it
  }
  m_lastCnpNs = now;
  ++m_cnps;
  m_alphaCnpArrived = true;
  m_decreaseCnpArrived = true;
  if (!m_firstCnp) {
    return;
  }
  // First congestion signal of this queue pair: start the alpha and rate-decrease clocks.
  m_firstCnp = false;
  m_alpha = 1.0;
  m_alphaCnpArrived = false;
  m_alphaEvent = Simulator::Schedule(m_alphaResumeInterval, &CcDcqcn::UpdateAlpha, this);
  // One extra ns so a cut due at the same instant as an alpha update sees the new alpha.
  m_decreaseEvent = Simulator::Schedule(m_rateDecreaseInterval + NanoSeconds(1), &CcDcqcn::CheckRateDecrease, this);
  SetRate(m_rateOnFirstCnp * static_cast<double>(m_rateBps.Get()));
  m_targetRateBps = m_rateBps.Get();
}

void CcDcqcn::UpdateAlpha() {
  m_alpha = (1.0 - m_g) * m_alpha + (m_alphaCnpArrived ? m_g : 0.0);
  m_alphaCnpArrived = false;
  m_alphaEvent = Simulator::Schedule(m_alphaResumeInterval, &CcDcqcn::UpdateAlpha, this);
}

void CcDcqcn::CheckRateDecrease() {
  m_decreaseEvent = Simulator::Schedule(m_rateDecreaseInterval, &CcDcqcn::CheckRateDecrease, this);
  if (!m_decreaseCnpArrived) {
    return;
  }
  m_decreaseCnpArrived = false;
  if (ClampsTarget()) {
    m_targetRateBps = m_rateBps.Get();
  }
  SetRate(static_cast<double>(m_rateBps.Get()) * (1.0 - m_alpha / 2.0));
  ++m_decreases;
  NS_LOG_DEBUG("cut to " << m_rateBps.Get() << " alpha " << m_alpha);
  m_timerStage = 0;
  m_byteStage = 0;
  m_bytesSinceIncrease = 0;
  m_rpEvent.Cancel();
  m_rpEvent = Simulator::Schedule(m_rpTimer, &CcDcqcn::RpTimerExpired, this);
}

bool CcDcqcn::ClampsTarget() const {
  // ConnectX's clamp_tgt_rate_after_time_inc (on by default): a cut takes the current rate as its target only
  // once the timer has raised the rate since the last cut, not after byte-counter increases alone.
  return m_clampTargetRate || m_timerStage != 0;
}

void CcDcqcn::RpTimerExpired() {
  m_rpEvent = Simulator::Schedule(m_rpTimer, &CcDcqcn::RpTimerExpired, this);
  IncreaseRate();
  ++m_timerStage;
}

void CcDcqcn::OnSend(uint32_t bytes, uint64_t /*nowNs*/) {
  if (m_byteCounter == 0 || m_firstCnp) {
    return;
  }
  m_bytesSinceIncrease += bytes;
  if (m_bytesSinceIncrease >= m_byteCounter) {
    m_bytesSinceIncrease -= m_byteCounter;
    IncreaseRate();
    ++m_byteStage;
  }
}

void CcDcqcn::IncreaseRate() {
  const uint32_t f = m_fastRecoveryTimes;
  // Timer only: stage < F fast recovery, == F additive, > F hyper. With a byte counter, the paper's rule:
  // fast recovery while both counters are below F, hyper increase once both exceed it.
  const uint32_t hi = m_byteCounter == 0 ? m_timerStage : std::max(m_timerStage, m_byteStage);
  const uint32_t lo = m_byteCounter == 0 ? m_timerStage : std::min(m_timerStage, m_byteStage);
  if (hi < f) {
    // Fast recovery: halve the distance to the target.
  } else if (lo > f) {
    m_targetRateBps = std::min(m_lineRateBps, m_targetRateBps + m_rhaiBps);
  } else {
    m_targetRateBps = std::min(m_lineRateBps, m_targetRateBps + m_raiBps);
  }
  SetRate((static_cast<double>(m_rateBps.Get()) + static_cast<double>(m_targetRateBps)) / 2.0);
}

void CcDcqcn::SetRate(double bps) {
  const double lo = static_cast<double>(std::min(m_minRateBps, m_lineRateBps));
  const double hi = static_cast<double>(m_lineRateBps);
  m_rateBps = static_cast<uint64_t>(std::clamp(bps, lo, hi));
}

void CcDcqcn::Stop() {
  m_alphaEvent.Cancel();
  m_decreaseEvent.Cancel();
  m_rpEvent.Cancel();
}

namespace {

/// When a pending event is due, in ns; -1 if it is not pending.
int64_t DueNs(const EventId& ev) {
  return ev.IsPending() ? (Simulator::Now() + Simulator::GetDelayLeft(ev)).GetNanoSeconds() : -1;
}

/// The first time `due` + k * `period` (k >= 0) at or after `nowNs`, and k.
int64_t SkipTo(int64_t due, int64_t period, int64_t nowNs, uint64_t& ticks) {
  ticks = due >= nowNs ? 0 : static_cast<uint64_t>((nowNs - due + period - 1) / period);
  return due + static_cast<int64_t>(ticks) * period;
}

}  // namespace

void CcDcqcn::OnIdle(uint64_t /*nowNs*/) {
  m_alphaDueNs = DueNs(m_alphaEvent);
  m_decreaseDueNs = DueNs(m_decreaseEvent);
  m_rpDueNs = DueNs(m_rpEvent);
  Stop();
}

void CcDcqcn::OnResume(uint64_t nowNs) {
  const auto now = static_cast<int64_t>(nowNs);
  const int64_t alphaP = m_alphaResumeInterval.GetNanoSeconds();
  const int64_t decP = m_rateDecreaseInterval.GetNanoSeconds();
  const int64_t rpP = m_rpTimer.GetNanoSeconds();
  // Replay the ticks due before now in time order. Ticks due at the same time run as the live timers would: the
  // one scheduled first, i.e. the one with the longest period (increase, then cut check, then alpha), first.
  // While a CNP of the last message is still to be acted on every tick matters; then alpha only decays (until it
  // is 0: no later tick changes it), a check finds no CNP, and an increase moves the rate towards the line rate
  // (until both rates reach it). The arithmetic is the timers' own, so the state is theirs to the bit.
  auto due = [now](int64_t t) { return t >= 0 && t < now ? t : INT64_MAX; };
  uint64_t ticks = 0;
  while (m_alphaCnpArrived || m_decreaseCnpArrived) {
    const int64_t a = due(m_alphaDueNs);
    const int64_t d = due(m_decreaseDueNs);
    const int64_t r = due(m_rpDueNs);
    const int64_t t = std::min({a, d, r});
    if (t == INT64_MAX) {
      break;
    }
    if (t == r) {
      IncreaseRate();
      ++m_timerStage;
      m_rpDueNs += rpP;
    } else if (t == d) {
      m_decreaseDueNs += decP;
      if (m_decreaseCnpArrived) {
        m_decreaseCnpArrived = false;
        if (ClampsTarget()) {
          m_targetRateBps = m_rateBps.Get();
        }
        SetRate(static_cast<double>(m_rateBps.Get()) * (1.0 - m_alpha / 2.0));
        ++m_decreases;
        m_timerStage = 0;
        m_byteStage = 0;
        m_bytesSinceIncrease = 0;
        m_rpDueNs = t + rpP;  // the cut restarts the increase timer
      }
    } else {
      m_alpha = (1.0 - m_g) * m_alpha + (m_alphaCnpArrived ? m_g : 0.0);
      m_alphaCnpArrived = false;
      m_alphaDueNs += alphaP;
    }
  }
  while (due(m_alphaDueNs) != INT64_MAX && m_alpha != 0.0) {
    m_alpha = (1.0 - m_g) * m_alpha + 0.0;
    m_alphaDueNs += alphaP;
  }
  if (m_alphaDueNs >= 0) {
    m_alphaDueNs = SkipTo(m_alphaDueNs, alphaP, now, ticks);
  }
  if (m_decreaseDueNs >= 0) {
    m_decreaseDueNs = SkipTo(m_decreaseDueNs, decP, now, ticks);
  }
  while (due(m_rpDueNs) != INT64_MAX && (m_rateBps.Get() != m_lineRateBps || m_targetRateBps != m_lineRateBps)) {
    IncreaseRate();
    ++m_timerStage;
    m_rpDueNs += rpP;
  }
  if (m_rpDueNs >= 0) {
    m_rpDueNs = SkipTo(m_rpDueNs, rpP, now, ticks);
    m_timerStage += static_cast<uint32_t>(std::min<uint64_t>(ticks, UINT32_MAX - m_timerStage));
  }
  // Rescheduled longest period first, so that ties later run in the live timers' order.
  if (m_rpDueNs >= 0) {
    m_rpEvent = Simulator::Schedule(NanoSeconds(m_rpDueNs - now), &CcDcqcn::RpTimerExpired, this);
  }
  if (m_decreaseDueNs >= 0) {
    m_decreaseEvent = Simulator::Schedule(NanoSeconds(m_decreaseDueNs - now), &CcDcqcn::CheckRateDecrease, this);
  }
  if (m_alphaDueNs >= 0) {
    m_alphaEvent = Simulator::Schedule(NanoSeconds(m_alphaDueNs - now), &CcDcqcn::UpdateAlpha, this);
  }
  m_alphaDueNs = m_decreaseDueNs = m_rpDueNs = -1;
}

void CcDcqcn::DoDispose() {
  Stop();
  CongestionControl::DoDispose();
}

}  // namespace ns3
