// TIMELY (Mittal et al., SIGCOMM 2015): rate control from the RTT gradient, in the per-RTT form of the HPCC
// RDMA models. Once per RTT of data: below T_low add delta; above T_high cut by beta * (1 - T_high / rtt);
// otherwise follow the sign of the smoothed RTT difference normalised by MinRtt (cut by beta * gradient),
// with hyper increase (N * delta) after HaiThreshold consecutive non-positive gradients. No window.
#ifndef PHANTORA_CC_TIMELY_H
#define PHANTORA_CC_TIMELY_H

#include "congestion-control.h"

#include "ns3/nstime.h"

namespace ns3 {

/// TIMELY rate controller, one per queue pair.
class CcTimely : public CongestionControl {
 public:
  static TypeId GetTypeId();
  CcTimely() = default;
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;
  void OnSend(uint32_t bytes, uint64_t nowNs) override;

  double GetRttDiffNs() const { return m_rttDiff; }

 private:
  // Attributes.
  double m_alpha = 0.875;
  double m_beta = 0.8;
  Time m_tLow;
  Time m_tHigh;
  Time m_minRtt;
  uint64_t m_raiBps = 0;   // 0 = 5 * bw / 25 Mb/s
  uint64_t m_rhaiBps = 0;  // 0 = 50 * bw / 25 Mb/s
  uint32_t m_haiThresh = 5;
  uint64_t m_minRateBps = 1000000000;

  // State.
  uint64_t m_sndNxt = 0;
  uint64_t m_lastUpdateSeq = 0;
  bool m_started = false;
  uint64_t m_lastRttNs = 0;
  double m_rttDiff = 0.0;
  uint64_t m_curRateBps = 0;
  uint32_t m_incStage = 0;
};

}  // namespace ns3

#endif  // PHANTORA_CC_TIMELY_H
