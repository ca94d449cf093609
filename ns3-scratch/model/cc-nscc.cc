// NSCC, the Ultra Ethernet network-signal congestion control (UEC specification 1.0, the sender-based CC of
// its congestion management; the reference model is htsim's uet-htsim, which we read to learn the algorithm).
// A congestion window in bytes, steered per ACK by two signals: the ECN echo (is the path congested?) and
// the queueing delay (RTT sample minus the base RTT, against a target):
//  - no mark, delay >= target: "fair increase", Fi x acked bytes into the increase accumulator;
//  - no mark, delay < target: "proportional increase", Alpha x acked x (target - delay), or, while the
//    delay stays under FastIncreaseDelay for a whole window, "fast increase" (cwnd += FiScale x acked);
//  - mark, average delay > target: multiplicative decrease, at most once per base RTT:
//    cwnd *= max(1 - Gamma (avg - target) / avg, 0.5);
//  - mark, delay < target: nothing (the NIC's load balancer moves the entropy off the marked path).
// The accumulator is applied (cwnd += inc / cwnd) once 8 MTUs are acknowledged or a base RTT has passed,
// which also adds Eta once per base RTT. Quick adapt: once per (base RTT + target) the sender looks at the
// bytes acknowledged in that period; if a NACK (a trimmed packet) came or the delay exceeded 4 x target and
// they are below MaxWnd / 2^QaGate, the window drops straight to what was achieved, and the feedback of the
// packets then in flight is ignored. A NACK (CcFeedback::nackedBytes, from Receiver = rud) takes the nacked
// bytes off the window unless quick adapt ran.
// Scaling (as the specification's): a = BDP / (100 Gb/s x 12 us), b = target / 12 us; Alpha = 4 MTU a b /
// target, Fi = 5 MTU a, Eta = 0.15 MTU a, FiScale = 0.25 a. MaxWnd = 1.5 BDP; the window starts there.
// Mapping onto the phantora NIC: the window is GetWindowBytes() (what the NIC lets be in flight; with
// Receiver = rud, bytes neither acknowledged nor lost); the NIC paces at line rate. The base RTT starts at the
// one the fabric gives (its GlobalT maximum by default, the specification's network RTT) and follows the
// smallest RTT sample of the flow, as htsim's does. With ReceiverCredit on (`--set cc.ReceiverCredit=true`) NSCC
// runs beside UET's receiver credits (RCCC, cc-rccc.cc): the NIC sends only what both the window and the credit
// allow, and asks for credit up to the window and one packet.
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/nstime.h"
#include "ns3/uinteger.h"

#include <algorithm>
#include <cmath>

namespace ns3 {

/// NSCC's window for one queue pair.
class CcNscc : public CongestionControl {
 public:
  static TypeId GetTypeId();
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override;
  void OnSend(uint32_t bytes, uint64_t nowNs) override { m_inFlight += bytes; }
  double CwndBytes() const { return m_w; }

 private:
  bool QuickAdapt(bool loss, bool marked, double delayNs, uint64_t nowNs);
  void OnNack(uint32_t bytes, uint64_t nowNs);
  void UpdateAvgDelay(double delayNs, bool marked);
  void Bound();
  void Apply();

  // Attributes.
  Time m_target;              // 0 = TargetRtts x the network RTT
  double m_targetRtts = 0.75;
  double m_gamma = 0.8;
  double m_delayAlpha = 0.0125;
  double m_maxWndBdps = 1.5;
  uint32_t m_qaGate = 3;
  bool m_quickAdapt = true;
  Time m_fastIncreaseDelay;
  double m_fastIncreaseNs = 0;  // m_fastIncreaseDelay in ns (Start)
  double m_fiFactor = 5.0;
  double m_etaFactor = 0.15;
  double m_alphaFactor = 4.0;
  double m_fiScaleFactor = 0.25;
  Time m_referenceRtt;
  uint64_t m_referenceRate = 100'000'000'000ULL;

  // Derived.
  double m_mtu = 1000;
  double m_targetNs = 0;
  double m_networkRttNs = 0;
  double m_alpha = 0;  // bytes per ns
  double m_fi = 0;
  double m_eta = 0;
  double m_fiScale = 0;
  double m_minWnd = 0;
  double m_maxWnd = 0;

  // State.
  double m_w = 0;              // the window in bytes, worked on per ACK
  TracedValue<double> m_cwnd;  // trace source "Cwnd": m_w after each ACK or NACK (Apply)
  double m_baseRttNs = 0;
  double m_avgDelayNs = 0;
  double m_inc = 0;
  uint64_t m_receivedBytes = 0;
  uint64_t m_achievedBytes = 0;
  uint64_t m_inFlight = 0;
  uint64_t m_bytesToIgnore = 0;
  uint64_t m_bytesIgnored = 0;
  bool m_triggerQa = false;
  uint64_t m_qaEndNs = 0;
  uint64_t m_lastDecreaseNs = 0;
  uint64_t m_lastAdjustNs = 0;
  uint64_t m_fiCount = 0;
  bool m_fastIncreasing = false;
};

NS_LOG_COMPONENT_DEFINE("PhantoraCcNscc");
PHANTORA_REGISTER_CC(CcNscc, "nscc");

TypeId CcNscc::GetTypeId() {
  static TypeId tid =
      AddCreditAttributes(PhantoraTypeId<CcNscc, CongestionControl>("ns3::CcNscc"), false)
          .AddAttribute("TargetQdelay", "Target queueing delay; 0 = TargetRtts x the network (base) RTT",
                        TimeValue(Time(0)), MakeTimeAccessor(&CcNscc::m_target), MakeTimeChecker(Time(0)))
          .AddAttribute("TargetRtts", "With TargetQdelay 0: the target in network RTTs (0.75 with trimming, 1 without)",
                        DoubleValue(0.75), MakeDoubleAccessor(&CcNscc::m_targetRtts), MakeDoubleChecker<double>(0.01))
          .AddAttribute("Gamma", "Multiplicative decrease constant", DoubleValue(0.8),
                        MakeDoubleAccessor(&CcNscc::m_gamma), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("DelayAlpha", "EWMA weight of a delay sample in the average delay", DoubleValue(0.0125),
                        MakeDoubleAccessor(&CcNscc::m_delayAlpha), MakeDoubleChecker<double>(0.0, 1.0))
          .AddAttribute("MaxWindow", "Largest window (and the first) in BDPs of the flow's path", DoubleValue(1.5),
                        MakeDoubleAccessor(&CcNscc::m_maxWndBdps), MakeDoubleChecker<double>(0.01))
          .AddAttribute("QuickAdapt", "Quick adapt on a NACK or a delay above 4 x target", BooleanValue(true),
                        MakeBooleanAccessor(&CcNscc::m_quickAdapt), MakeBooleanChecker())
          .AddAttribute("QaGate", "Quick adapt only when the bytes achieved are below MaxWindow / 2^QaGate",
                        UintegerValue(3), MakeUintegerAccessor(&CcNscc::m_qaGate), MakeUintegerChecker<uint32_t>(0, 30))
          .AddAttribute("FastIncreaseDelay", "Fast increase while the queueing delay stays under this",
                        TimeValue(MicroSeconds(1)), MakeTimeAccessor(&CcNscc::m_fastIncreaseDelay),
                        MakeTimeChecker(Time(0)))
          .AddAttribute("Fi", "Fair increase in MTUs x a (bytes of accumulator per acknowledged byte)",
                        DoubleValue(5.0), MakeDoubleAccessor(&CcNscc::m_fiFactor), MakeDoubleChecker<double>(0.0))
          .AddAttribute("Eta", "Additive increase per base RTT in MTUs x a", DoubleValue(0.15),
                        MakeDoubleAccessor(&CcNscc::m_etaFactor), MakeDoubleChecker<double>(0.0))
          .AddAttribute("Alpha", "Proportional increase in MTUs x a x b / target", DoubleValue(4.0),
                        MakeDoubleAccessor(&CcNscc::m_alphaFactor), MakeDoubleChecker<double>(0.0))
          .AddAttribute("FiScale", "Fast increase per acknowledged byte, x a", DoubleValue(0.25),
                        MakeDoubleAccessor(&CcNscc::m_fiScaleFactor), MakeDoubleChecker<double>(0.0))
          .AddAttribute("ReferenceRtt", "RTT of the reference network the constants are scaled from",
                        TimeValue(MicroSeconds(12)), MakeTimeAccessor(&CcNscc::m_referenceRtt),
                        MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("ReferenceRate", "Line rate (bit/s) of the reference network", UintegerValue(100'000'000'000ULL),
                        MakeUintegerAccessor(&CcNscc::m_referenceRate), MakeUintegerChecker<uint64_t>(1))
          .AddTraceSource("Cwnd", "The congestion window in bytes", MakeTraceSourceAccessor(&CcNscc::m_cwnd),
                          "ns3::TracedValueCallback::Double");
  return tid;
}

void CcNscc::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  m_mtu = std::max<double>(mtuBytes, 1.0);
  m_networkRttNs = std::max<double>(static_cast<double>(baseRttNs), 1.0);
  m_baseRttNs = m_networkRttNs;
  m_targetNs = m_target.IsStrictlyPositive() ? static_cast<double>(m_target.GetNanoSeconds())
                                             : m_targetRtts * m_networkRttNs;
  const double bdp = static_cast<double>(lineRateBps) * m_networkRttNs / 8e9;
  const double refRttNs = static_cast<double>(m_referenceRtt.GetNanoSeconds());
  const double refBdp = static_cast<double>(m_referenceRate) * refRttNs / 8e9;
  const double a = bdp / refBdp;
  const double b = m_targetNs / refRttNs;
  m_alpha = m_alphaFactor * m_mtu * a * b / m_targetNs;
  m_fi = m_fiFactor * m_mtu * a;
  m_eta = m_etaFactor * m_mtu * a;
  m_fiScale = m_fiScaleFactor * a;
  m_minWnd = m_mtu;
  m_fastIncreaseNs = static_cast<double>(m_fastIncreaseDelay.GetNanoSeconds());
  m_maxWnd = std::max(m_maxWndBdps * bdp, m_minWnd);
  m_w = m_maxWnd;
  m_rateBps = lineRateBps;
  NS_LOG_LOGIC("nscc: target " << m_targetNs << " ns, maxwnd " << m_maxWnd << " B, a " << a << ", b " << b);
  Apply();
}

void CcNscc::UpdateAvgDelay(double delayNs, bool marked) {
  if (!marked && delayNs > m_targetNs) {
    // Delay without a mark: another flow's queue or a path not ours; pull the average toward base / 4.
    m_avgDelayNs = m_delayAlpha * m_baseRttNs * 0.25 + (1 - m_delayAlpha) * m_avgDelayNs;
  } else {
    m_avgDelayNs = m_delayAlpha * delayNs + (1 - m_delayAlpha) * m_avgDelayNs;
  }
}

bool CcNscc::QuickAdapt(bool loss, bool marked, double delayNs, uint64_t nowNs) {
  if (!m_quickAdapt) {
    return false;
  }
  bool done = false;
  if (marked && m_bytesIgnored < m_bytesToIgnore) {
    done = true;  // feedback of packets sent before the last quick adapt
  } else if (nowNs > m_qaEndNs) {
    if (m_qaEndNs != 0 && (m_triggerQa || loss || delayNs > 4 * m_targetNs) &&
        static_cast<double>(m_achievedBytes) < std::ldexp(m_maxWnd, -static_cast<int>(m_qaGate))) {
      NS_LOG_LOGIC("nscc quick adapt: cwnd " << m_w << " -> " << m_achievedBytes);
      m_w = std::max(static_cast<double>(m_achievedBytes), m_minWnd);
      m_bytesToIgnore = m_inFlight;
      m_bytesIgnored = 0;
      m_triggerQa = false;
      done = true;
    }
    m_achievedBytes = 0;
    m_qaEndNs = nowNs + static_cast<uint64_t>(m_baseRttNs + m_targetNs);
  }
  if (done) {
    m_inc = 0;
    m_receivedBytes = 0;
  }
  return done;
}

void CcNscc::OnNack(uint32_t bytes, uint64_t nowNs) {
  m_inFlight -= std::min<uint64_t>(m_inFlight, bytes);
  m_bytesIgnored += bytes;
  UpdateAvgDelay(m_networkRttNs, true);  // a trim means a full queue: about a network RTT of delay
  m_triggerQa = true;
  if (!QuickAdapt(true, true, 0, nowNs)) {
    m_w = m_w - bytes;
  }
  Bound();
  Apply();
}

void CcNscc::OnAck(const CcFeedback& fb) {
  if (fb.nackedBytes > 0) {
    OnNack(fb.nackedBytes, fb.nowNs);
    return;
  }
  const uint64_t newly = fb.newlyAcked;
  m_inFlight -= std::min<uint64_t>(m_inFlight, newly);
  m_achievedBytes += newly;
  m_receivedBytes += newly;
  m_bytesIgnored += newly;
  const bool marked = fb.ecnEcho;
  double delay = m_avgDelayNs;
  if (fb.rttNs != 0) {
    const double rtt = static_cast<double>(fb.rttNs);
    m_baseRttNs = std::min(m_baseRttNs, rtt);
    delay = rtt - m_baseRttNs;
    UpdateAvgDelay(delay, marked);
  }
  if (QuickAdapt(false, marked, delay, fb.nowNs)) {
    Bound();
    Apply();
    return;
  }
  if (!marked) {
    const bool fast = delay < m_fastIncreaseNs;
    m_fiCount = fast ? m_fiCount + newly : 0;
    if (fast && (m_fastIncreasing || static_cast<double>(m_fiCount) > m_w)) {
      m_w = m_w + static_cast<double>(newly) * m_fiScale;  // fast increase: a window of near-empty queues
      m_fastIncreasing = true;
    } else {
      m_fastIncreasing = false;
      if (delay >= m_targetNs) {
        m_inc += m_fi * static_cast<double>(newly);  // fair increase
      } else {
        m_inc += m_alpha * static_cast<double>(newly) * (m_targetNs - delay);  // proportional increase
      }
    }
  } else {
    m_fastIncreasing = false;
    m_fiCount = 0;
    if (m_avgDelayNs > m_targetNs && static_cast<double>(fb.nowNs - m_lastDecreaseNs) > m_baseRttNs) {
      m_w = std::max(m_w * std::max(1 - m_gamma * (m_avgDelayNs - m_targetNs) / m_avgDelayNs, 0.5), m_minWnd);
      m_lastDecreaseNs = fb.nowNs;
    }
  }
  Bound();
  if (static_cast<double>(m_receivedBytes) > 8 * m_mtu ||
      static_cast<double>(fb.nowNs - m_lastAdjustNs) > m_networkRttNs) {
    m_w = m_w + m_inc / m_w;  // fulfil the accumulated increase
    if (static_cast<double>(fb.nowNs - m_lastAdjustNs) >= m_networkRttNs) {
      m_w = m_w + m_eta;
      m_lastAdjustNs = fb.nowNs;
    }
    m_inc = 0;
    m_receivedBytes = 0;
  }
  Bound();
  Apply();
}

void CcNscc::Bound() { m_w = std::clamp(m_w, m_minWnd, m_maxWnd); }

void CcNscc::Apply() {
  m_cwnd = m_w;
  m_windowBytes = static_cast<uint64_t>(std::ceil(m_w));
}

}  // namespace ns3
