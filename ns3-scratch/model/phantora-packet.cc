// PhantoraPacket: the ns-3 Packet view for trace sinks.
#include "phantora-packet.h"

namespace ns3 {

Ptr<Packet> PhantoraPacket::ToPacket() const {
  const bool payload = hdr.type == PktType::Data && !(hdr.flags & kFlagTrimmed);
  Ptr<Packet> pkt = Create<Packet>(payload ? hdr.payload : 0);
  pkt->AddHeader(hdr);
  return pkt;
}

}  // namespace ns3
