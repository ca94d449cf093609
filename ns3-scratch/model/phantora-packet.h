// A packet of the phantora fabric: its header as a struct, read and changed in place at every hop.
#ifndef PHANTORA_PACKET_H
#define PHANTORA_PACKET_H

#include "phantora-header.h"
#include "phantora-pool.h"

#include "ns3/packet.h"
#include "ns3/ptr.h"
#include "ns3/simple-ref-count.h"

namespace ns3 {

/**
 * What travels through the devices, channels and queues of the fabric. Every device and channel is
 * ours, so the header never goes through a byte buffer: a switch reads `hdr` as it is and marks CE, stamps
 * INT or trims in place. The bytes a packet occupies on the wire are WireFormat's, as before. Made from a
 * free list (no malloc per packet).
 */
class PhantoraPacket : public SimpleRefCount<PhantoraPacket> {
 public:
  PHANTORA_POOLED(PhantoraPacket)

  PhantoraHeader hdr;

  /// The packet as an ns-3 Packet, for trace sinks: `hdr` serialised in front of the payload (no payload for
  /// control packets and trimmed data), as the fabric carried it before it carried structs.
  Ptr<Packet> ToPacket() const;
};

}  // namespace ns3

#endif  // PHANTORA_PACKET_H
