// The one header of every phantora fabric packet: data, ACK, NACK and PFC frames.
#ifndef PHANTORA_HEADER_H
#define PHANTORA_HEADER_H

#include "congestion-control.h"

#include "ns3/header.h"

#include <algorithm>
#include <cstdint>

namespace ns3 {

/// Packet kinds on the phantora fabric.
enum class PktType : uint8_t { Data = 0, Ack = 1, Nack = 2, Pfc = 3, Credit = 4 };  // Credit: UET RCCC grant

/// Header flag bits.
constexpr uint8_t kFlagCe = 1;       ///< data: congestion experienced (set by a switch)
constexpr uint8_t kFlagEcnEcho = 2;  ///< ACK/NACK: the acknowledged data packet was CE-marked
constexpr uint8_t kFlagPause = 4;    ///< PFC: 1 = pause (XOFF), 0 = resume (XON)
constexpr uint8_t kFlagLossTolerant = 8;  ///< data: a switch may trim it to its header under congestion (DLCP)
constexpr uint8_t kFlagTrimmed = 16;      ///< data: trimmed, the payload is gone; NACK: the loss budget is spent
constexpr uint8_t kFlagSack = 32;    ///< ACK: carries a SACK block [sackLo, sackHi) (selective receiver)
constexpr uint8_t kFlagDsack = 64;   ///< ACK: the data packet was a duplicate (selective receiver; RFC 2883)
/// Data: carries its flow's last byte (the bit of kFlagDsack, which only ACKs carry). Set by a NIC told to mark
/// (RdmaNic::MarkLastByte: in a partition worker, or an engine asked for CompletionBounds), read by switches that
/// report where it is (PfcSwitch::SetLastByteHook).
constexpr uint8_t kFlagLastByte = 64;
constexpr uint8_t kFlagCredit = 128;  ///< data: carries a credit request in `credit` (receiver credits, RCCC)
/// On the wire, the type byte's top bit carries `viaNic` (its low bits the PktType): the serialised size of every
/// header stays what it was before the route had a field of its own.
constexpr uint8_t kTypeViaNic = 0x80;

/**
 * Every field of a PhantoraHeader but its INT records. A packet taken from the free list resets these only
 * (PhantoraPacket::Make): nothing reads an INT record past `nHops`, so the 256 bytes of `hops` are left as they
 * were instead of written per packet. The order keeps what every hop reads (type to `viaNic`: a switch's route,
 * class, wire bytes and traces) in the 64 bytes of the packet's first cache line (PhantoraPacket's layout).
 */
struct PhantoraHeaderFields {
  PktType type = PktType::Data;
  uint8_t prio = 0;       ///< traffic class; for PFC the paused class
  uint8_t flags = 0;      ///< kFlag* bits
  uint8_t nHops = 0;      ///< INT records present
  uint32_t src = 0;       ///< source node id
  uint32_t dst = 0;       ///< destination node id
  uint32_t payload = 0;   ///< payload bytes (data)
  uint64_t flowId = 0;    ///< queue pair (flow) id
  uint64_t seq = 0;       ///< data: first payload byte; ACK/NACK: next byte expected
  uint64_t ecmpKey = 0;   ///< flow key hashed by ECMP (only hashed: the route through the NICs is `viaNic`)
  bool viaNic = false;    ///< its flow leaves its endpoints through their NICs, even over a shared NVSwitch
  uint16_t entropy = 0;   ///< data: UET entropy value (LoadBalancing reps/oblivious hash it); ACK/NACK: echoed
  uint64_t tsNs = 0;      ///< data: send time; ACK: echoed send time of the data packet
  uint64_t sackLo = 0;    ///< ACK with kFlagSack: first byte of the received block holding the data packet
  uint64_t sackHi = 0;    ///< ACK with kFlagSack: one past its last byte
  uint64_t sackBitmap = 0;  ///< ACK with kFlagSack, Receiver rud: bit i = packet at seq + i x payload received
  uint64_t credit = 0;    ///< data with kFlagCredit: the cumulative grant asked for; Credit: the cumulative grant
};

/**
 * Routing, transport and telemetry fields of a packet. The serialised form carries every field
 * at full precision (INT records too); the bytes a packet occupies on the wire are modelled
 * separately (payload + configured header overhead), so this size does not affect timing.
 */
class PhantoraHeader : public Header, public PhantoraHeaderFields {
 public:
  static TypeId GetTypeId();
  TypeId GetInstanceTypeId() const override;
  uint32_t GetSerializedSize() const override;
  void Serialize(Buffer::Iterator start) const override;
  uint32_t Deserialize(Buffer::Iterator start) override;
  void Print(std::ostream& os) const override;

  /// Append one INT record (ignored once kMaxIntHops are present).
  void PushHop(const IntHop& hop);
  /// A Credit packet, or data carrying a credit request: `credit` is serialised.
  bool HasCredit() const;
  /// Every field as a new header's, but the INT records past nHops = 0, which stay as they were (never read).
  void ResetFields() { static_cast<PhantoraHeaderFields&>(*this) = PhantoraHeaderFields{}; }
  /// `*this = h` without the INT records past h.nHops (never read).
  void AssignUsed(const PhantoraHeader& h) {
    static_cast<PhantoraHeaderFields&>(*this) = h;
    std::copy(h.hops, h.hops + std::min<uint32_t>(h.nHops, kMaxIntHops), hops);
  }

  IntHop hops[kMaxIntHops] = {};
};

}  // namespace ns3

#endif  // PHANTORA_HEADER_H
