// Output-queued shared-buffer switch: ECMP forwarding, 8 classes per port, PFC, RED-ECN, INT.
#ifndef PHANTORA_PFC_SWITCH_H
#define PHANTORA_PFC_SWITCH_H

#include "class-scheduler.h"
#include "load-balancer.h"
#include "phantora-net-device.h"
#include "phantora-routing.h"
#include "switch-mmu.h"
#include "wire-format.h"

#include "ns3/node.h"
#include "ns3/nstime.h"
#include "ns3/object.h"
#include "ns3/random-variable-stream.h"
#include "ns3/traced-callback.h"

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ns3 {

/**
 * A switch (or, with attribute NvSwitch, an NVSwitch: unlimited buffer, no PFC, no ECN).
 * Class 0 of every port is strict priority (PFC frames, ACKs); classes 1..7 are served as attribute
 * ClassScheduling says (round robin by default, strict priority or weighted), each skipped while the
 * downstream port has paused it. A loss-tolerant data packet that finds its egress class queue above
 * TrimThreshold is trimmed to its header (DLCP; see docs/packet-model.md). With TrimHeaderPriority (Ultra
 * Ethernet), a trimmable packet the buffer cannot take is trimmed instead of dropped, and trimmed headers are
 * queued in the strict-priority class 0 at every switch. With CreditFlowControl, every port's upstream
 * sender holds link credit per data class (CreditSize bytes of this switch's buffer) and sends only against it;
 * the switch gives the credit back as the packet leaves its buffer (PhantoraNetDevice documents the mechanism),
 * so nothing is dropped and PFC is off. Ingress accounting, XOFF/XON and drops come from SwitchMmu; ECN
 * marking and INT stamping happen at dequeue. Settings are attributes;
 * the defaults follow the HPCC reference models (REFERENCE.md section 5).
 */
class PfcSwitch : public Object, public PortOwner {
 public:
  static TypeId GetTypeId();

  /// Counters of this switch (summed over the fabric by PhantoraNetwork::Stats).
  struct Counters {
    uint64_t drops = 0;
    uint64_t ecnMarks = 0;
    uint64_t pfcPause = 0;
    uint64_t pfcResume = 0;
    uint64_t trims = 0;  ///< loss-tolerant packets trimmed to their header
    uint64_t trimmedBytes = 0;  ///< payload bytes those packets lost
  };

  /// Link credit of each (ingress port, data class) under CreditFlowControl (0: off or an NVSwitch).
  uint64_t CreditSize(uint32_t port) const { return port < m_creditSize.size() ? m_creditSize[port] : 0; }

  /// Own the PhantoraNetDevices of `node` (port i = device i), as fabric node `nodeId`. Reads the
  /// attributes: sizes the buffer and headroom from the ports' rates and delays, and the ECN thresholds.
  /// Throws std::invalid_argument on a bad KminMap / KmaxMap / PmaxMap.
  void Install(Ptr<Node> node, uint32_t nodeId, Ptr<RouteTable> routes);

  bool Dequeue(uint32_t port, const bool* paused, TxItem& out) override;
  void Receive(uint32_t port, const Ptr<PhantoraPacket>& pkt) override;

  uint32_t NumPorts() const { return static_cast<uint32_t>(m_ports.size()); }
  uint64_t QueueBytes(uint32_t port, uint32_t cls) const { return m_ports[port].bytes[cls]; }
  uint64_t PortBytes(uint32_t port) const { return m_ports[port].total; }
  uint64_t EcnMarks(uint32_t port) const { return m_ports[port].ecnMarks; }
  uint64_t Drops(uint32_t port) const { return m_ports[port].drops; }
  uint64_t MaxPortBytes(uint32_t port) const { return m_ports[port].maxTotal; }
  const SwitchMmu& Mmu() const { return m_mmu; }
  /// What port `port`'s settings resolved to at Install (PhantoraNetwork::EffectiveParams reports them): its
  /// line rate, ECN kmin / kmax / pmax (the rate maps, else their per-Gb/s defaults) and its PFC headroom.
  struct PortSettings {
    uint64_t rateBps;
    uint64_t kmin;
    uint64_t kmax;
    double pmax;
    uint64_t headroomBytes;
  };
  PortSettings ResolvedPort(uint32_t port) const;
  const LoadBalancer& Lb() const { return m_lb; }
  const Counters& GetCounters() const { return m_counters; }
  /// No packet is lost here (PFC on, no trimming, credit flow control off; not an NVSwitch): a packet it queues
  /// leaves after every byte queued ahead of it.
  bool Lossless() const { return m_pfc && !m_nvSwitch && m_trimBytes == 0 && !m_trimHeaderPrio && !m_cbfc; }
  /// (flow, its sender, its receiver, the next node, the least ns the packet reaches it) for each data packet
  /// with its flow's last byte (kFlagLastByte) this switch queues: it leaves after the bytes queued ahead of it in
  /// its class and in the strict-priority class 0, at the port's line rate, then crosses the cable.
  using LastByteHook = std::function<void(uint64_t, uint32_t, uint32_t, uint32_t, int64_t)>;
  void SetLastByteHook(LastByteHook hook) { m_lastByteHook = std::move(hook); }

 protected:
  void DoDispose() override;

 private:
  /// An egress port's queues and state, cache-line aligned: what every packet reads first (line 0: the class
  /// mask, totals, ECN and trim thresholds; line 1: the bytes per class; line 2: the class scheduler's turn), the
  /// queues (five cache lines) last.
  struct alignas(64) Port {
    uint32_t nonEmpty = 0;  ///< bit c: q[c] holds a packet
    uint64_t total = 0;
    uint64_t maxTotal = 0;    ///< peak of total
    uint64_t txBytes = 0;     ///< cumulative bytes sent (INT)
    uint64_t kmin = 0, kmax = 0;
    double pmax = 0;
    uint64_t trim = 0;        ///< trim threshold (bytes of the egress class queue; 0 = never)
    std::array<uint64_t, kNumPrio> bytes{};
    ClassSchedState sched;    ///< class scheduler state (round robin turn, DRR credits)
    uint64_t rateBps = 0;     ///< the rate kmin, kmax and trim are set for
    uint64_t kmin0 = 0, kmax0 = 0, trim0 = 0, rate0 = 0;  ///< as installed (ThresholdsFollowRate scales these)
    uint64_t ecnMarks = 0;    ///< marks made at this egress port
    uint64_t drops = 0;       ///< packets dropped arriving on this ingress port
    std::array<RingQueue<TxItem>, kNumPrio> q;
  };

  void SendPfc(uint32_t port, uint32_t cls, bool pause);
  /// Cut a loss-tolerant packet bound for egress `port` to its header; return its wire bytes now.
  uint32_t Trim(uint32_t port, uint32_t cls, PhantoraHeader& hdr);
  bool EcnMark(const Port& p, uint64_t qlen);
  /// ThresholdsFollowRate: rescale egress `port`'s trim and ECN thresholds if its rate has changed.
  void FollowRate(uint32_t port);
  uint64_t GetHeaderSize() const;
  void SetHeaderSize(uint64_t bytes);
  uint64_t GetIntHeaderSize() const;
  void SetIntHeaderSize(uint64_t bytes);
  uint64_t GetPfcFrameSize() const;
  void SetPfcFrameSize(uint64_t bytes);
  bool GetIntEnabled() const;
  void SetIntEnabled(bool on);

  uint32_t m_id = 0;
  // Attributes.
  bool m_nvSwitch = false;
  WireFormat m_wire;
  bool m_pfc = true;
  uint64_t m_bufferBytes = 0;
  uint64_t m_reserveBytes = 4096;
  uint64_t m_resumeOffsetBytes = 3072;
  uint32_t m_dtShift = 3;
  double m_headroomFactor = 3.0;
  uint64_t m_headroomBytes = 0;
  bool m_ecnEnabled = true;
  std::string m_kminMap;
  std::string m_kmaxMap;
  std::string m_pmaxMap;
  std::string m_classSchedText = "rr";
  std::string m_classWeightsText;
  uint64_t m_trimBytes = 0;
  bool m_trimHeaderPrio = false;
  bool m_followRate = false;
  ClassSched m_classSched = ClassSched::RoundRobin;
  std::array<uint32_t, kNumPrio> m_classWeights{};
  std::string m_lbMode = "ecmp";
  Time m_flowletGap;
  bool m_cbfc = false;
  uint64_t m_creditBytes = 0;
  uint64_t m_creditUpdateBytes = 0;
  uint64_t m_payloadBytes = 1000;
  // State.
  std::vector<uint64_t> m_creditSize;
  Ptr<RouteTable> m_routes;
  bool m_ecn = false;
  Counters m_counters;
  std::vector<Ptr<PhantoraNetDevice>> m_dev;
  std::vector<Port> m_ports;
  SwitchMmu m_mmu;
  Ptr<UniformRandomVariable> m_rng;
  LoadBalancer m_lb;
  LastByteHook m_lastByteHook;
  /// SetLastByteHook's report for a packet about to be queued at egress `port`, class `cls`.
  void LastByteQueued(uint32_t port, uint32_t cls, uint32_t wire, const PhantoraHeader& hdr);

  TracedCallback<uint32_t, uint32_t, bool> m_pfcTxTrace;              ///< (port, class, pause) sent upstream
  TracedCallback<uint32_t, uint32_t, uint64_t, uint64_t> m_dropTrace; ///< (ingress port, class, flow, seq)
  TracedCallback<uint32_t, uint32_t, uint64_t> m_ecnTrace;            ///< (egress port, class, flow)
  TracedCallback<uint32_t, uint32_t, uint64_t, uint64_t, uint32_t> m_trimTrace;  ///< (egress port, class, flow, seq, payload)
  TracedCallback<uint64_t, uint64_t, uint64_t, uint32_t, uint64_t> m_lbTrace;  ///< (flow, seq, sent ns, port, flowlet)
};

}  // namespace ns3

#endif  // PHANTORA_PFC_SWITCH_H
