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

  uint32_t Bytes(const PhantoraHeader& h) const {
    switch (h.type) {
      case PktType::Data:
        return ((h.flags & kFlagTrimmed) ? 0 : h.payload) + headerBytes + (intOn ? intHeaderBytes : 0);
      case PktType::Pfc:
        return pfcBytes;
      default:
        return headerBytes + (intOn ? intHeaderBytes : 0);
    }
  }
};

}  // namespace ns3

#endif  // PHANTORA_WIRE_FORMAT_H
