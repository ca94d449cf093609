// Congestion-control interface of the phantora RDMA NIC: one object per queue pair.
// A CC is one .cc file: a CongestionControl subclass with an ns-3 TypeId (its attributes and defaults) and
// PHANTORA_REGISTER_CC(Class, "name"), which makes `--cc name` and `--set cc.ATTR=VALUE` reach it. The NIC
// creates one per queue pair, calls Start() once, OnSend() per data packet and OnAck() per ACK, paces at
// GetRateBps() and keeps at most GetWindowBytes() in flight (0 = no window). A queue pair may carry several
// messages one after another (a connection): ACK sequence numbers run on across them, and between messages the
// CC is told OnIdle() and OnResume().
#ifndef PHANTORA_CONGESTION_CONTROL_H
#define PHANTORA_CONGESTION_CONTROL_H

#include "ns3/object.h"
#include "ns3/traced-value.h"
#include "ns3/type-id.h"

#include <cstdint>
#include <string>
#include <vector>

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
  bool ecnEcho;               // the acknowledged data packet arrived CE-marked (a CNP for DCQCN, ECE for DCTCP)
  uint64_t rttNs;             // now - send timestamp echoed in the ACK (TIMELY)
  uint32_t nHops;             // INT stack copied from the data packet (HPCC)
  IntHop hops[kMaxIntHops];
  uint32_t nackedBytes = 0;   // Receiver rud: payload bytes a NACK reports trimmed (0 for an ACK; NSCC's loss signal)
};

/// Base class of the per-queue-pair congestion controllers.
class CongestionControl : public Object {   // one instance per queue pair, created from a TypeId name
 public:
  static TypeId GetTypeId();
  virtual void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes);
  virtual void OnAck(const CcFeedback& fb) = 0;
  virtual void OnSend(uint32_t bytes, uint64_t nowNs) {}
  virtual void Stop() {}                     // cancel timers when the queue pair closes
  /// The queue pair went idle (its last message finished): by default stop the timers, as Stop().
  virtual void OnIdle(uint64_t /*nowNs*/) { Stop(); }
  /// A message starts on the idle queue pair: bring time-driven state up to date (default: nothing to do).
  virtual void OnResume(uint64_t /*nowNs*/) {}
  virtual bool WantsInt() const { return false; }
  /// Whether this CC's notification point sends CNPs: true for CCs that react to them (DCQCN). The receiving NIC
  /// then marks the ACK of a CE-marked packet as a CNP (the NIC counts it as one, `cnps`, and fires "CnpRx");
  /// for any other CC the ACK only echoes the mark (ECE, `ecn_echoes`): no CNP is generated.
  virtual bool UsesCnp() const { return false; }
  uint64_t GetRateBps() const;               // pacing rate the NIC must use now
  uint64_t GetWindowBytes() const;           // in-flight cap; 0 = no window
  /// Receiver credits (UET RCCC): the NIC sends this queue pair's data only against credit its receiver grants,
  /// beyond a speculative first round trip (uet-credit.h). Off unless the CC's ReceiverCredit attribute is on.
  bool UsesReceiverCredit() const { return m_creditOn; }
  uint64_t SpeculativeCreditBytes() const;   // SpeculativeCredit BDPs of the queue pair's path
  uint64_t MaxCreditBytes() const;           // MaxCredit BDPs
 protected:
  /// `tid` with the attributes ReceiverCredit (default `on`), SpeculativeCredit and MaxCredit: a CC that may run
  /// under receiver credits adds them to its TypeId.
  static TypeId AddCreditAttributes(TypeId tid, bool on);
  TracedValue<uint64_t> m_rateBps;           // trace source "Rate"
  uint64_t m_windowBytes = 0;
  uint64_t m_lineRateBps = 0;
  uint64_t m_bdpBytes = 0;                   // the BDP given to Start
  bool m_creditOn = false;
  double m_speculativeBdps = 1.0;
  double m_maxCreditBdps = 1.5;
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

/// The congestion controls by short name (`--cc NAME`). Each CC's own file adds itself with
/// PHANTORA_REGISTER_CC when the library (or a user's CC library) is loaded; nothing else lists them.
class CcRegistry {
 public:
  /// Register `getTypeId` under `name` (PHANTORA_REGISTER_CC calls it at load time); returns true.
  static bool Add(const std::string& name, TypeId (*getTypeId)());
  /// The registered names, sorted.
  static std::vector<std::string> Names();
  /// The TypeId of a registered name, or of a CongestionControl TypeId name such as "ns3::CcDcqcn".
  /// Throws std::invalid_argument naming the registered ones.
  static TypeId Lookup(const std::string& name);
  /// Every registered CC as JSON: {name: {"typeid", "wants_int", "attributes": {attr: {"type", "default",
  /// "help"}}}}, names and attributes sorted (`phantora-ns3-runner --list-cc` prints it).
  static std::string Json();
};

}  // namespace ns3

/// Register CongestionControl subclass `Class` as `--cc Name` (and with ns-3's TypeId system), at file scope.
#define PHANTORA_REGISTER_CC(Class, Name) \
  NS_OBJECT_ENSURE_REGISTERED(Class);      \
  static const bool g_phantoraCcRegistered##Class [[maybe_unused]] = ::ns3::CcRegistry::Add(Name, &Class::GetTypeId)

#endif  // PHANTORA_CONGESTION_CONTROL_H
