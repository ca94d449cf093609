// Base congestion-control object and CcNone (line rate, no window).
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/log.h"
#include "ns3/trace-source-accessor.h"

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCongestionControl");
NS_OBJECT_ENSURE_REGISTERED(CongestionControl);
NS_OBJECT_ENSURE_REGISTERED(CcNone);

TypeId CongestionControl::GetTypeId() {
  static TypeId tid = TypeId("ns3::CongestionControl")
                          .SetParent<Object>()
                          .SetGroupName("Phantora")
                          .AddTraceSource("Rate", "Pacing rate of the queue pair (bit/s)",
                                          MakeTraceSourceAccessor(&CongestionControl::m_rateBps),
                                          "ns3::TracedValueCallback::Uint64");
  return tid;
}

void CongestionControl::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  NS_LOG_FUNCTION(this << lineRateBps << baseRttNs << mtuBytes << bdpBytes);
  m_lineRateBps = lineRateBps;
  m_rateBps = lineRateBps;
  m_windowBytes = 0;
}

uint64_t CongestionControl::GetRateBps() const { return m_rateBps.Get(); }

uint64_t CongestionControl::GetWindowBytes() const { return m_windowBytes; }

TypeId CcNone::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcNone, CongestionControl>("ns3::CcNone")
                          .AddAttribute("HasWindow", "Cap the bytes in flight at one BDP", BooleanValue(false),
                                        MakeBooleanAccessor(&CcNone::m_hasWindow), MakeBooleanChecker());
  return tid;
}

void CcNone::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  m_windowBytes = m_hasWindow ? bdpBytes : 0;
}

}  // namespace ns3
