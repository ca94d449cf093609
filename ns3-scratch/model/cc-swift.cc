// Swift (Kumar et al., "Swift: Delay is Simple and Effective for Congestion Control in the Datacenter",
// SIGCOMM 2020): AIMD on a congestion window, steered by the measured delay against a target delay.
// The whole CC is this one file: the class, its attributes with their defaults, and its registration.
//
// How it maps onto the phantora NIC (rdma-nic.cc), which both caps bytes in flight (GetWindowBytes) and
// paces (GetRateBps):
//  - the window is the NIC's in-flight cap: max(cwnd, 1) packets of MTU payload;
//  - below one packet (cwnd < 1, large incasts) Swift paces one packet per rtt / cwnd (section 3.3), i.e. a
//    rate of cwnd * MTU / rtt; at cwnd >= 1 the rate is the line rate and the window alone limits.
//  - the delay is the RTT the ACK reports (send stamp echoed). The NIC answers every data packet at once
//    and has no receive queue, so the endpoint (host) part of the delay is zero here and the whole RTT is
//    fabric delay: Swift's second, endpoint window (section 3.2) would never bind, and is left out. The
//    target's host share is the HostTarget attribute, a fixed allowance (e.g. for ACK coalescing delay).
//  - topology-based scaling (section 3.5) grows the target with the path's hop count; here the target
//    starts from the path's unloaded base RTT that the fabric hands the CC (its GlobalT setting decides
//    whether that is the pair's RTT or the fabric-wide maximum), which grows with the path in the same way.
//  - the NIC tells the CC of no retransmission timeouts (go-back-N is the NIC's own), so Algorithm 1's
//    timeout and fast-recovery branches do not run; on a lossless (PFC) fabric they would not anyway.
// Defaults: Beta 0.8, MaxMdf 0.5, FsMinCwnd 0.1, FsMaxCwnd 100, FsRange 5 x BaseTarget and MinCwnd 0.001 are
// the values open Swift models use for the paper's parameters (the formulas are the paper's: Algorithm 1 in
// section 3.1, pacing in 3.3, target scaling in 3.5); BaseTarget 5 us and Ai 1 packet are our choices for
// 100-400G fabrics with microsecond links.
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/nstime.h"

#include <algorithm>
#include <cmath>

namespace ns3 {

/// Swift's fabric congestion window for one queue pair (Algorithm 1 of the paper), in packets.
class CcSwift : public CongestionControl {
 public:
  static TypeId GetTypeId();
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;

 private:
  double TargetDelayNs() const;
  void Apply(double cwnd, double rttNs);

  // Attributes (see GetTypeId and the defaults above).
  Time m_baseTarget;
  Time m_hostTarget;
  double m_ai = 1.0;
  double m_beta = 0.8;
  double m_maxMdf = 0.5;
  double m_fsRangeFactor = 5.0;
  double m_fsMinCwnd = 0.1;
  double m_fsMaxCwnd = 100.0;
  double m_minCwnd = 0.001;
  double m_maxCwnd = 0.0;   // 0 = one BDP at the target delay
  double m_initCwnd = 0.0;  // 0 = the largest window

  // State.
  double m_cwnd = 1.0;
  double m_mtu = 1.0;
  double m_baseRttNs = 0.0;
  double m_fsAlpha = 0.0;
  double m_fsBeta = 0.0;
  uint64_t m_lastDecreaseNs = 0;
};

NS_LOG_COMPONENT_DEFINE("PhantoraCcSwift");
PHANTORA_REGISTER_CC(CcSwift, "swift");

TypeId CcSwift::GetTypeId() {
  static TypeId tid =
      PhantoraTypeId<CcSwift, CongestionControl>("ns3::CcSwift")
          .AddAttribute("BaseTarget", "Fabric queueing delay allowed above the path's base RTT (section 3.5)",
                        TimeValue(MicroSeconds(5)), MakeTimeAccessor(&CcSwift::m_baseTarget),
                        MakeTimeChecker(Time(0)))
          .AddAttribute("HostTarget", "Host (endpoint) delay allowed on top of the fabric target (section 3.2)",
                        TimeValue(Time(0)), MakeTimeAccessor(&CcSwift::m_hostTarget), MakeTimeChecker(Time(0)))
          .AddAttribute("Ai", "Additive increment: packets added to cwnd per RTT below the target (ai)",
                        DoubleValue(1.0), MakeDoubleAccessor(&CcSwift::m_ai), MakeDoubleChecker<double>(0.0))
          .AddAttribute("Beta", "Multiplicative decrease constant (beta)", DoubleValue(0.8),
                        MakeDoubleAccessor(&CcSwift::m_beta), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("MaxMdf", "Largest multiplicative decrease per RTT (max_mdf)", DoubleValue(0.5),
                        MakeDoubleAccessor(&CcSwift::m_maxMdf), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("FsRange", "Flow-based scaling: the most added to the target, in units of BaseTarget",
                        DoubleValue(5.0), MakeDoubleAccessor(&CcSwift::m_fsRangeFactor),
                        MakeDoubleChecker<double>(0.0))
          .AddAttribute("FsMinCwnd", "Flow-based scaling: cwnd (packets) at which the full FsRange is added",
                        DoubleValue(0.1), MakeDoubleAccessor(&CcSwift::m_fsMinCwnd), MakeDoubleChecker<double>(1e-6))
          .AddAttribute("FsMaxCwnd", "Flow-based scaling: cwnd (packets) from which nothing is added",
                        DoubleValue(100.0), MakeDoubleAccessor(&CcSwift::m_fsMaxCwnd), MakeDoubleChecker<double>(1e-6))
          .AddAttribute("MinCwnd", "Smallest cwnd in packets (below 1: one packet per rtt / cwnd)", DoubleValue(0.001),
                        MakeDoubleAccessor(&CcSwift::m_minCwnd), MakeDoubleChecker<double>(1e-9))
          .AddAttribute("MaxCwnd", "Largest cwnd in packets; 0 = line rate x (base RTT + BaseTarget)", DoubleValue(0.0),
                        MakeDoubleAccessor(&CcSwift::m_maxCwnd), MakeDoubleChecker<double>(0.0))
          .AddAttribute("InitCwnd", "Starting cwnd in packets; 0 = MaxCwnd (start at line rate, as the other CCs)",
                        DoubleValue(0.0), MakeDoubleAccessor(&CcSwift::m_initCwnd), MakeDoubleChecker<double>(0.0));
  return tid;
}

void CcSwift::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  m_mtu = std::max<double>(mtuBytes, 1.0);
  m_baseRttNs = static_cast<double>(baseRttNs);
  if (m_maxCwnd <= 0.0) {
    const double targetNs = m_baseRttNs + static_cast<double>(m_baseTarget.GetNanoSeconds());
    m_maxCwnd = std::max(1.0, static_cast<double>(lineRateBps) * targetNs / 8e9 / m_mtu);
  }
  m_minCwnd = std::min(m_minCwnd, m_maxCwnd);
  // Flow-based scaling (section 3.5): target += clamp(alpha / sqrt(cwnd) + beta, 0, range), with alpha and
  // beta chosen so that the addition is `range` at FsMinCwnd and 0 at FsMaxCwnd.
  const double range = m_fsRangeFactor * static_cast<double>(m_baseTarget.GetNanoSeconds());
  const double span = 1.0 / std::sqrt(m_fsMinCwnd) - 1.0 / std::sqrt(m_fsMaxCwnd);
  m_fsAlpha = span > 0.0 ? range / span : 0.0;
  m_fsBeta = -m_fsAlpha / std::sqrt(m_fsMaxCwnd);
  const double init = m_initCwnd > 0.0 ? m_initCwnd : m_maxCwnd;
  Apply(std::clamp(init, m_minCwnd, m_maxCwnd), std::max(m_baseRttNs, 1.0));
}

double CcSwift::TargetDelayNs() const {
  const double range = m_fsRangeFactor * static_cast<double>(m_baseTarget.GetNanoSeconds());
  const double flowScaling = std::clamp(m_fsAlpha / std::sqrt(m_cwnd) + m_fsBeta, 0.0, range);
  return m_baseRttNs + static_cast<double>(m_baseTarget.GetNanoSeconds()) + flowScaling +
         static_cast<double>(m_hostTarget.GetNanoSeconds());
}

void CcSwift::OnAck(const CcFeedback& fb) {
  if (fb.rttNs == 0) {
    return;
  }
  const double delay = static_cast<double>(fb.rttNs);
  const double acked = static_cast<double>(fb.newlyAcked) / m_mtu;
  const double target = TargetDelayNs();
  const double before = m_cwnd;
  double cwnd = before;
  if (delay < target) {  // additive increase: ai packets per window's worth of ACKs
    cwnd += before >= 1.0 ? m_ai / before * acked : m_ai * acked;
  } else if (fb.nowNs - m_lastDecreaseNs >= fb.rttNs) {  // multiplicative decrease, at most once per RTT
    cwnd *= std::max(1.0 - m_beta * (delay - target) / delay, 1.0 - m_maxMdf);
  }
  cwnd = std::clamp(cwnd, m_minCwnd, m_maxCwnd);
  if (cwnd < before) {
    m_lastDecreaseNs = fb.nowNs;
  }
  Apply(cwnd, delay);
}

void CcSwift::Apply(double cwnd, double rttNs) {
  m_cwnd = cwnd;
  m_windowBytes = static_cast<uint64_t>(std::ceil(std::max(cwnd, 1.0) * m_mtu));
  if (cwnd >= 1.0) {
    m_rateBps = m_lineRateBps;
  } else {  // pacing: one packet every rtt / cwnd
    const double bps = cwnd * m_mtu * 8e9 / rttNs;
    m_rateBps = std::clamp<uint64_t>(static_cast<uint64_t>(bps), 1, m_lineRateBps);
  }
}

}  // namespace ns3
