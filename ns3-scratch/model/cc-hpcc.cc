// HPCC sender: see cc-hpcc.h.
#include "cc-hpcc.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/uinteger.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCcHpcc");
PHANTORA_REGISTER_CC(CcHpcc, "hpcc");

TypeId CcHpcc::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcHpcc, CongestionControl>("ns3::CcHpcc")
          .AddAttribute("TargetUtil", "Target utilisation eta", DoubleValue(0.95),
                        MakeDoubleAccessor(&CcHpcc::m_targetUtil), MakeDoubleChecker<double>(0.01, 1.0))
          .AddAttribute("MiThresh", "Additive-increase rounds before a multiplicative step (maxStage)",
                        UintegerValue(0), MakeUintegerAccessor(&CcHpcc::m_miThresh), MakeUintegerChecker<uint32_t>())
          .AddAttribute("RateAi", "Additive increase W_ai as a rate in bit/s; 0 = 10*bw/25 Mb/s (bw in Gb/s)",
                        UintegerValue(0), MakeUintegerAccessor(&CcHpcc::m_raiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("MinRate", "Lowest pacing rate in bit/s", UintegerValue(1000000000ULL),
                        MakeUintegerAccessor(&CcHpcc::m_minRateBps), MakeUintegerChecker<uint64_t>(1))
          .AddAttribute("FastReact", "React to every ACK, not only once per RTT", BooleanValue(true),
                        MakeBooleanAccessor(&CcHpcc::m_fastReact), MakeBooleanChecker())
          .AddAttribute("VarWin", "Window follows the rate (BDP * rate / line rate); else a fixed BDP window",
                        BooleanValue(true), MakeBooleanAccessor(&CcHpcc::m_varWin), MakeBooleanChecker())
          .AddAttribute("SampleFeedback", "On fast-react ACKs, ignore hops whose queue is empty", BooleanValue(false),
                        MakeBooleanAccessor(&CcHpcc::m_sampleFeedback), MakeBooleanChecker());
  return tid;
}

void CcHpcc::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  if (m_raiBps == 0) {
    m_raiBps = lineRateBps / 2500;  // 40 Mb/s at 100 Gb/s
  }
  m_baseRttNs = std::max<uint64_t>(baseRttNs, 1);
  m_bdpBytes = std::max<uint64_t>(bdpBytes, mtuBytes);
  m_curRateBps = lineRateBps;
  m_u = 1.0;
  SetRate(static_cast<double>(lineRateBps));
}

void CcHpcc::OnSend(uint32_t bytes, uint64_t /*nowNs*/) { m_sndNxt += bytes; }

void CcHpcc::OnAck(const CcFeedback& fb) {
  if (fb.ackSeq > m_lastUpdateSeq) {
    Update(fb, false);  // a full RTT of feedback since the last commit
  } else if (m_fastReact) {
    Update(fb, true);
  }
}

void CcHpcc::Update(const CcFeedback& fb, bool fastReact) {
  const uint32_t n = std::min(fb.nHops, kMaxIntHops);
  if (!m_haveHops || n != m_nHops) {
    // First ACK (or the path changed): remember the hops and start a round.
    m_haveHops = true;
    m_lastUpdateSeq = std::max(m_sndNxt, fb.ackSeq);
    m_nHops = n;
    std::copy(fb.hops, fb.hops + n, m_hops);
    return;
  }
  const double win = static_cast<double>(m_bdpBytes);
  const double maxRate = static_cast<double>(m_lineRateBps);
  double maxU = 0.0;
  uint64_t dt = 0;
  bool any = false;
  for (uint32_t i = 0; i < n; ++i) {
    const IntHop& now = fb.hops[i];
    const IntHop& old = m_hops[i];
    if (m_sampleFeedback && fastReact && now.qlenBytes == 0) {
      continue;
    }
    if (now.timeNs <= old.timeNs || now.lineRateBps == 0) {
      continue;  // no time has passed at this hop: no rate sample
    }
    const uint64_t tau = now.timeNs - old.timeNs;
    const uint64_t bytes = now.txBytes >= old.txBytes ? now.txBytes - old.txBytes : 0;
    const double hopRate = static_cast<double>(now.lineRateBps);
    const double txRate = static_cast<double>(bytes) * 8e9 / static_cast<double>(tau);
    const double qlen = static_cast<double>(std::min(now.qlenBytes, old.qlenBytes));
    const double u = txRate / hopRate + qlen * maxRate / hopRate / win;
    any = true;
    if (u > maxU) {
      maxU = u;
      dt = tau;
    }
  }
  if (any) {
    dt = std::min(dt, m_baseRttNs);
    const double t = static_cast<double>(m_baseRttNs);
    m_u = (m_u * (t - static_cast<double>(dt)) + maxU * static_cast<double>(dt)) / t;
    const double maxC = m_u / m_targetUtil;
    const double cur = static_cast<double>(m_curRateBps);
    const double ai = static_cast<double>(m_raiBps);
    double next;
    uint32_t nextStage;
    if (maxC >= 1.0 || m_incStage >= m_miThresh) {
      next = maxC > 0.0 ? cur / maxC + ai : maxRate;
      nextStage = 0;
    } else {
      next = cur + ai;
      nextStage = m_incStage + 1;
    }
    SetRate(next);
    if (!fastReact) {
      m_curRateBps = m_rateBps.Get();
      m_incStage = nextStage;
    }
  }
  if (!fastReact) {
    m_lastUpdateSeq = std::max(m_lastUpdateSeq, m_sndNxt);
  }
  std::copy(fb.hops, fb.hops + n, m_hops);
}

void CcHpcc::SetRate(double bps) {
  const double lo = static_cast<double>(std::min(m_minRateBps, m_lineRateBps));
  const double hi = static_cast<double>(m_lineRateBps);
  const uint64_t rate = static_cast<uint64_t>(std::clamp(bps, lo, hi));
  m_rateBps = rate;
  if (m_varWin) {
    // BDP * rate / line rate, in double: the product overflows 64 bits for large BDPs at 800G.
    const double w = static_cast<double>(m_bdpBytes) * static_cast<double>(rate) / static_cast<double>(m_lineRateBps);
    m_windowBytes = std::max<uint64_t>(static_cast<uint64_t>(w), 1);
  } else {
    m_windowBytes = m_bdpBytes;
  }
}

}  // namespace ns3
