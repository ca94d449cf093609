// HPCC (Li et al., SIGCOMM 2019): window control from in-band network telemetry.
//
// Every ACK carries the INT records of the data packet's hops. Per ACK the sender estimates the normalised
// inflight U of the most loaded hop (tx rate / line rate + queue / BDP), smooths it over one base RTT and
// sets W = W_ref / (U / eta) + W_ai ("fast react"); once per RTT the reference window W_ref is committed.
// The window is expressed as a rate (window = BDP * rate / line rate, VAR_WIN), and the NIC paces at it.
// Byte counters and times are 64-bit and all ratios are computed in double, so 400G and 800G are safe.
#ifndef PHANTORA_CC_HPCC_H
#define PHANTORA_CC_HPCC_H

#include "congestion-control.h"

namespace ns3 {

/// HPCC sender, one per queue pair.
class CcHpcc : public CongestionControl {
 public:
  static TypeId GetTypeId();
  CcHpcc() = default;
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;
  void OnSend(uint32_t bytes, uint64_t nowNs) override;
  bool WantsInt() const override { return true; }

  double GetUtilisation() const { return m_u; }
  uint64_t GetReferenceRateBps() const { return m_curRateBps; }

 private:
  void Update(const CcFeedback& fb, bool fastReact);
  void SetRate(double bps);

  // Attributes.
  double m_targetUtil = 0.95;
  uint32_t m_miThresh = 0;
  uint64_t m_raiBps = 0;  // 0 = 10 * bw / 25 Mb/s
  uint64_t m_minRateBps = 1000000000;
  bool m_fastReact = true;
  bool m_varWin = true;
  bool m_sampleFeedback = false;

  // State.
  uint64_t m_baseRttNs = 1;
  uint64_t m_bdpBytes = 0;
  uint64_t m_sndNxt = 0;          // bytes handed to the wire so far
  uint64_t m_lastUpdateSeq = 0;   // ack seq that closes the current RTT round
  bool m_haveHops = false;
  uint64_t m_curRateBps = 0;      // reference rate (W_ref / T)
  uint32_t m_incStage = 0;
  double m_u = 1.0;
  uint32_t m_nHops = 0;
  IntHop m_hops[kMaxIntHops] = {};
};

}  // namespace ns3

#endif  // PHANTORA_CC_HPCC_H
