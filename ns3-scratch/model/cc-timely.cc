// TIMELY sender: see cc-timely.h.
#include "cc-timely.h"
#include "phantora-type-id.h"

#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/uinteger.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCcTimely");
PHANTORA_REGISTER_CC(CcTimely, "timely");

TypeId CcTimely::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcTimely, CongestionControl>("ns3::CcTimely")
          .AddAttribute("Alpha", "EWMA weight of the newest RTT difference", DoubleValue(0.875),
                        MakeDoubleAccessor(&CcTimely::m_alpha), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("Beta", "Multiplicative decrease factor", DoubleValue(0.8),
                        MakeDoubleAccessor(&CcTimely::m_beta), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("TLow", "RTT below which the rate always grows", TimeValue(MicroSeconds(50)),
                        MakeTimeAccessor(&CcTimely::m_tLow), MakeTimeChecker())
          .AddAttribute("THigh", "RTT above which the rate always shrinks", TimeValue(MicroSeconds(500)),
                        MakeTimeAccessor(&CcTimely::m_tHigh), MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("MinRtt", "RTT that normalises the gradient", TimeValue(MicroSeconds(20)),
                        MakeTimeAccessor(&CcTimely::m_minRtt), MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("RateAi", "Additive step delta in bit/s; 0 = 5*bw/25 Mb/s (bw in Gb/s)", UintegerValue(0),
                        MakeUintegerAccessor(&CcTimely::m_raiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("RateHai", "Hyper-increase step in bit/s; 0 = 50*bw/25 Mb/s", UintegerValue(0),
                        MakeUintegerAccessor(&CcTimely::m_rhaiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("HaiThreshold", "Consecutive increase rounds before hyper increase (N)", UintegerValue(5),
                        MakeUintegerAccessor(&CcTimely::m_haiThresh), MakeUintegerChecker<uint32_t>())
          .AddAttribute("MinRate", "Lowest pacing rate in bit/s", UintegerValue(1000000000ULL),
                        MakeUintegerAccessor(&CcTimely::m_minRateBps), MakeUintegerChecker<uint64_t>(1));
  return tid;
}

void CcTimely::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  if (m_raiBps == 0) {
    m_raiBps = lineRateBps / 5000;
  }
  if (m_rhaiBps == 0) {
    m_rhaiBps = lineRateBps / 500;
  }
  m_curRateBps = lineRateBps;
  m_windowBytes = 0;
}

void CcTimely::OnSend(uint32_t bytes, uint64_t /*nowNs*/) { m_sndNxt += bytes; }

void CcTimely::OnAck(const CcFeedback& fb) {
  if (fb.ackSeq <= m_lastUpdateSeq) {
    return;  // one decision per RTT of data
  }
  const uint64_t rtt = fb.rttNs;
  if (m_started) {
    const double newDiff = static_cast<double>(rtt) - static_cast<double>(m_lastRttNs);
    m_rttDiff = (1.0 - m_alpha) * m_rttDiff + m_alpha * newDiff;
    const double gradient = m_rttDiff / static_cast<double>(m_minRtt.GetNanoSeconds());
    const uint64_t tLow = m_tLow.GetNanoSeconds();
    const uint64_t tHigh = m_tHigh.GetNanoSeconds();
    const double cur = static_cast<double>(m_curRateBps);
    double next;
    if (rtt < tLow || (rtt <= tHigh && gradient <= 0.0)) {
      const uint64_t step = m_incStage < m_haiThresh ? m_raiBps : m_rhaiBps;
      next = cur + static_cast<double>(step);
      ++m_incStage;
    } else {
      const double c = rtt > tHigh ? 1.0 - m_beta * (1.0 - static_cast<double>(tHigh) / static_cast<double>(rtt))
                                   : std::max(0.0, 1.0 - m_beta * gradient);
      next = cur * c;
      m_incStage = 0;
    }
    const double lo = static_cast<double>(std::min(m_minRateBps, m_lineRateBps));
    m_rateBps = static_cast<uint64_t>(std::clamp(next, lo, static_cast<double>(m_lineRateBps)));
    m_curRateBps = m_rateBps.Get();
  }
  m_started = true;
  m_lastRttNs = rtt;
  m_lastUpdateSeq = std::max(m_sndNxt, fb.ackSeq);
}

}  // namespace ns3
