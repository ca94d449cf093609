// The bytes a packet of the phantora fabric occupies on the wire.
#ifndef PHANTORA_WIRE_FORMAT_H
#define PHANTORA_WIRE_FORMAT_H

#include "phantora-header.h"

#include <cstdint>

namespace ns3 {

/**
 * Per-packet overheads, set from the attributes of the NIC or switch that owns a copy (HeaderSize,
 * IntHeaderSize, PfcFrameSize, IntEnabled). The serialised PhantoraHeader does not time anything:
 * a packet occupies payload + these bytes.
 */
struct WireFormat {
  uint32_t headerBytes = 48;     ///< data and ACK/NACK header overhead
  uint32_t intHeaderBytes = 42;  ///< INT space reserved in data packets and ACKs when INT is on
  uint32_t pfcBytes = 64;        ///< a PFC frame
  bool intOn = false;

  /// An untrimmed data packet of `payload` bytes: Bytes of its header, without building one.
  uint32_t DataBytes(uint32_t payload) const { return payload + headerBytes + (intOn ? intHeaderBytes : 0); }

  uint32_t Bytes(const PhantoraHeader& h) const {
    switch (h.type) {
      case PktType::Data:
        return DataBytes((h.flags & kFlagTrimmed) ? 0 : h.payload);
      case PktType::Pfc:
        return pfcBytes;
      default:
        return headerBytes + (intOn ? intHeaderBytes : 0);
    }
  }
};

/**
 * Picoseconds `bytes` take at `rateBps`, exactly: the sub-ps remainder (in bit-ps per rate units) carries over
 * in `rem` (< rateBps), so a long run keeps the exact line rate. 64-bit arithmetic when it cannot overflow
 * (any packet), 128-bit otherwise; the same result either way.
 */
inline uint64_t SerialisationPs(uint64_t bytes, uint64_t rateBps, uint64_t& rem) {
  constexpr uint64_t kBitPs = 8'000'000'000'000ULL;  // ps per bit at 1 bit/s
  uint64_t q;
  if (bytes <= (UINT64_MAX - rem) / kBitPs) {
    const uint64_t bits = bytes * kBitPs + rem;
    q = bits / rateBps;
    rem = bits % rateBps;
  } else {
    const unsigned __int128 bits = static_cast<unsigned __int128>(bytes) * kBitPs + rem;
    q = static_cast<uint64_t>(bits / rateBps);
    rem = static_cast<uint64_t>(bits % rateBps);
  }
  return q;
}

}  // namespace ns3

#endif  // PHANTORA_WIRE_FORMAT_H
