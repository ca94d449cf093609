// DCQCN reaction point (Zhu et al., SIGCOMM 2015), in the timer-driven form of the HPCC RDMA models.
//
// A CE-echoing ACK plays the role of a CNP. Alpha is refreshed every AlphaResumeInterval; the rate is cut
// at most once per RateDecreaseInterval, by (1 - alpha/2). Increases come from the RP timer (and, when
// ByteCounter > 0, from a byte counter as in the paper): fast recovery, then additive, then hyper increase.
// A cut sets the target to the current rate when ClampTargetRate is on (the paper), else only after a timer
// increase since the last cut (ConnectX's clamp_tgt_rate_after_time_inc; byte-counter increases do not count).
// There is no window. Rates scale with the line rate where the reference does (AI, HAI).
// On a persistent queue pair the timers stop while it is idle (so an idle fabric has no events) and OnResume
// replays the ticks that fell due meanwhile: alpha decays, a pending cut happens, the rate recovers, exactly as
// if the timers had kept running.
#ifndef PHANTORA_CC_DCQCN_H
#define PHANTORA_CC_DCQCN_H

#include "congestion-control.h"

#include "ns3/event-id.h"
#include "ns3/nstime.h"

namespace ns3 {

/// DCQCN rate controller, one per queue pair.
class CcDcqcn : public CongestionControl {
 public:
  static TypeId GetTypeId();
  CcDcqcn() = default;
  ~CcDcqcn() override { Stop(); }
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;
  void OnSend(uint32_t bytes, uint64_t nowNs) override;
  void Stop() override;
  void OnIdle(uint64_t nowNs) override;
  void OnResume(uint64_t nowNs) override;
  bool UsesCnp() const override { return true; }

  double GetAlpha() const { return m_alpha; }
  uint64_t GetTargetRateBps() const { return m_targetRateBps; }
  uint64_t GetCnpCount() const { return m_cnps; }
  uint64_t GetDecreaseCount() const { return m_decreases; }

 protected:
  void DoDispose() override;

 private:
  void OnCnp();
  void UpdateAlpha();
  void CheckRateDecrease();
  bool ClampsTarget() const;
  void RpTimerExpired();
  void IncreaseRate();
  void SetRate(double bps);

  // Attributes.
  double m_g = 1.0 / 256;
  Time m_alphaResumeInterval;
  Time m_rateDecreaseInterval;
  Time m_rpTimer;
  uint32_t m_fastRecoveryTimes = 1;
  uint64_t m_raiBps = 0;    // 0 = 5 * bw / 25 Mb/s
  uint64_t m_rhaiBps = 0;   // 0 = 50 * bw / 25 Mb/s
  uint64_t m_minRateBps = 1000000000;
  double m_rateOnFirstCnp = 1.0;
  bool m_clampTargetRate = false;
  uint64_t m_byteCounter = 0;  // bytes per increase event; 0 = timer only (as the HPCC models)
  Time m_cnpInterval;          // CNPs closer than this to the last one taken are ignored; 0 = none are

  // State.
  double m_alpha = 1.0;
  uint64_t m_targetRateBps = 0;
  bool m_firstCnp = true;
  bool m_alphaCnpArrived = false;
  bool m_decreaseCnpArrived = false;
  uint32_t m_timerStage = 0;
  uint32_t m_byteStage = 0;
  uint64_t m_bytesSinceIncrease = 0;
  int64_t m_lastCnpNs = -1;  // when the last CNP taken arrived (ns; -1 = none yet)
  uint64_t m_cnps = 0;
  uint64_t m_decreases = 0;
  EventId m_alphaEvent;
  EventId m_decreaseEvent;
  EventId m_rpEvent;
  // While idle: when each stopped timer was next due (ns; -1 = it was not running).
  int64_t m_alphaDueNs = -1;
  int64_t m_decreaseDueNs = -1;
  int64_t m_rpDueNs = -1;
};

}  // namespace ns3

#endif  // PHANTORA_CC_DCQCN_H
