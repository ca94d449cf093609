// DCTCP (Alizadeh et al., SIGCOMM 2010), rate-based as in the HPCC RDMA models.
//
// Alpha is an EWMA (gain g) of the fraction of CE-echoing ACKs over each window of data. On the first marked
// ACK outside a CWR round the rate is cut by (1 - alpha/2) and a round starts that ends when everything sent
// so far is acknowledged (at most one cut per RTT). Outside CWR the rate grows by RateAi once per window of
// data. A fixed window of one BDP caps the bytes in flight. Switches mark with kmin = kmax = 30*bw/10 KB.
#ifndef PHANTORA_CC_DCTCP_H
#define PHANTORA_CC_DCTCP_H

#include "congestion-control.h"

namespace ns3 {

/// DCTCP rate controller, one per queue pair.
class CcDctcp : public CongestionControl {
 public:
  static TypeId GetTypeId();
  CcDctcp() = default;
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;
  void OnSend(uint32_t bytes, uint64_t nowNs) override;

  double GetAlpha() const { return m_alpha; }

 private:
  // Attributes.
  double m_g = 1.0 / 16;
  uint64_t m_raiBps = 615000000;
  uint64_t m_minRateBps = 1000000000;
  bool m_hasWindow = true;

  // State.
  uint32_t m_mtu = 1000;
  uint64_t m_sndNxt = 0;
  uint64_t m_lastUpdateSeq = 0;
  bool m_started = false;
  double m_alpha = 1.0;
  uint64_t m_ecnCount = 0;
  uint64_t m_batchPackets = 1;
  bool m_inCwr = false;
  uint64_t m_cwrEndSeq = 0;
};

}  // namespace ns3

#endif  // PHANTORA_CC_DCTCP_H
