// Congestion-control interface of the phantora RDMA NIC: one object per queue pair.
// The NIC creates it by TypeId name (ns3::CcNone, ns3::CcDcqcn, ns3::CcHpcc, ns3::CcTimely, ns3::CcDctcp),
// calls Start() once, OnSend() per data packet and OnAck() per ACK, and paces at GetRateBps().
#ifndef PHANTORA_CONGESTION_CONTROL_H
#define PHANTORA_CONGESTION_CONTROL_H

#include "ns3/object.h"
#include "ns3/traced-value.h"
#include "ns3/type-id.h"

#include <cstdint>

namespace ns3 {

constexpr uint32_t kMaxIntHops = 8;

/// One INT record stamped by a switch egress port (HPCC).
struct IntHop {
  uint64_t timeNs;       ///< time the packet left the port
  uint64_t txBytes;      ///< cumulative bytes sent on that port
  uint32_t qlenBytes;    ///< egress queue length when the packet left
  uint64_t lineRateBps;  ///< port line rate
};

/// What the sender learns from one ACK.
struct CcFeedback {           // one per ACK received by the sender
  uint64_t nowNs;
  uint64_t ackSeq;            // cumulative bytes acknowledged
  uint32_t newlyAcked;        // bytes newly acknowledged by this ACK
  bool ecnEcho;               // the acknowledged data packet arrived CE-marked (CNP for DCQCN, ECE for DCTCP)
  uint64_t rttNs;             // now - send timestamp echoed in the ACK (TIMELY)
  uint32_t nHops;             // INT stack copied from the data packet (HPCC)
  IntHop hops[kMaxIntHops];
};

/// Base class of the per-queue-pair congestion controllers.
class CongestionControl : public Object {   // one instance per queue pair, created from a TypeId name
 public:
  static TypeId GetTypeId();
  virtual void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes);
  virtual void OnAck(const CcFeedback& fb) = 0;
  virtual void OnSend(uint32_t bytes, uint64_t nowNs) {}
  virtual void Stop() {}                     // cancel timers when the flow ends
  virtual bool WantsInt() const { return false; }
  uint64_t GetRateBps() const;               // pacing rate the NIC must use now
  uint64_t GetWindowBytes() const;           // in-flight cap; 0 = no window
 protected:
  TracedValue<uint64_t> m_rateBps;           // trace source "Rate"
  uint64_t m_windowBytes = 0;
  uint64_t m_lineRateBps = 0;
};

/// No congestion control: line rate; no window unless attribute HasWindow (then one BDP).
class CcNone : public CongestionControl {
 public:
  static TypeId GetTypeId();
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override;
  void OnAck(const CcFeedback& fb) override {}

 private:
  bool m_hasWindow = false;
};

}  // namespace ns3

#endif  // PHANTORA_CONGESTION_CONTROL_H
