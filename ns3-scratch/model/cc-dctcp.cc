// DCTCP sender: see cc-dctcp.h.
#include "cc-dctcp.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/uinteger.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCcDctcp");
PHANTORA_REGISTER_CC(CcDctcp, "dctcp");

TypeId CcDctcp::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcDctcp, CongestionControl>("ns3::CcDctcp")
          .AddAttribute("G", "Alpha EWMA gain g", DoubleValue(1.0 / 16), MakeDoubleAccessor(&CcDctcp::m_g),
                        MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("RateAi", "Additive increase per window of data, in bit/s", UintegerValue(615000000ULL),
                        MakeUintegerAccessor(&CcDctcp::m_raiBps), MakeUintegerChecker<uint64_t>())
          .AddAttribute("MinRate", "Lowest pacing rate in bit/s", UintegerValue(1000000000ULL),
                        MakeUintegerAccessor(&CcDctcp::m_minRateBps), MakeUintegerChecker<uint64_t>(1))
          .AddAttribute("HasWindow", "Cap the bytes in flight at one BDP", BooleanValue(true),
                        MakeBooleanAccessor(&CcDctcp::m_hasWindow), MakeBooleanChecker());
  return tid;
}

void CcDctcp::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  m_mtu = std::max<uint32_t>(mtuBytes, 1);
  m_windowBytes = m_hasWindow ? std::max<uint64_t>(bdpBytes, m_mtu) : 0;
}

void CcDctcp::OnSend(uint32_t bytes, uint64_t /*nowNs*/) { m_sndNxt += bytes; }

void CcDctcp::OnAck(const CcFeedback& fb) {
  const uint64_t sndNxt = std::max(m_sndNxt, fb.ackSeq);
  bool newBatch = false;
  m_ecnCount += fb.ecnEcho ? 1 : 0;
  if (fb.ackSeq > m_lastUpdateSeq) {
    // A window of data has been acknowledged: fold its marked fraction into alpha.
    newBatch = true;
    if (m_started) {
      const double frac = std::min(1.0, static_cast<double>(m_ecnCount) / static_cast<double>(m_batchPackets));
      m_alpha = (1.0 - m_g) * m_alpha + m_g * frac;
      m_batchPackets = (sndNxt - fb.ackSeq) / m_mtu + 1;
    } else {
      m_batchPackets = sndNxt / m_mtu + 1;
    }
    m_started = true;
    m_ecnCount = 0;
    m_lastUpdateSeq = sndNxt;
  }
  if (m_inCwr && fb.ackSeq > m_cwrEndSeq) {
    m_inCwr = false;
  }
  const double lo = static_cast<double>(std::min(m_minRateBps, m_lineRateBps));
  const double hi = static_cast<double>(m_lineRateBps);
  if (fb.ecnEcho && !m_inCwr) {
    m_inCwr = true;
    m_cwrEndSeq = sndNxt;
    const double cut = static_cast<double>(m_rateBps.Get()) * (1.0 - m_alpha / 2.0);
    m_rateBps = static_cast<uint64_t>(std::clamp(cut, lo, hi));
  }
  if (!m_inCwr && newBatch) {
    const double up = static_cast<double>(m_rateBps.Get()) + static_cast<double>(m_raiBps);
    m_rateBps = static_cast<uint64_t>(std::clamp(up, lo, hi));
  }
}

}  // namespace ns3
