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
class PhantoraPacket;

/// SimpleRefCount's deleter for PhantoraPacket: the last reference puts the packet on a free list (not
/// destroyed: the header's ns-3 base classes cost a constructor and destructor call chain per packet).
struct PacketRecycler {
  static void Delete(PhantoraPacket* p);
};

class PhantoraPacket : public SimpleRefCount<PhantoraPacket, Empty, PacketRecycler> {
 public:
  PHANTORA_POOLED(PhantoraPacket)

  /// A packet with a default header (as Create<PhantoraPacket>()), from the free list when it has one.
  static Ptr<PhantoraPacket> Make() {
    if (s_free == nullptr) {
      return Create<PhantoraPacket>();
    }
    PhantoraPacket* p = s_free;
    s_free = p->m_next;
    p->hdr = Blank();  // every field as a new packet's
    p->linkCredit = 0;
    p->linkSent = 0;
    p->linkClass = 0;
    return Ptr<PhantoraPacket>(p);  // SimpleRefCount left its count at 0: this reference makes it 1
  }

  PhantoraHeader hdr;
  /// Link credit (credit-based flow control): the bytes of class `linkClass` credit the sending port spent on
  /// this packet, which the receiving switch returns when the packet leaves its buffer; 0 = none spent. Set by
  /// the sending PhantoraNetDevice for each hop (link-layer bookkeeping, no wire bytes of its own). `linkSent`:
  /// the port's cumulative credited bytes of that class, this packet included (InfiniBand's FCTBS): the
  /// receiver gives back the credit of packets the link lost in between.
  uint32_t linkCredit = 0;
  uint64_t linkSent = 0;
  uint8_t linkClass = 0;

  /// The packet as an ns-3 Packet, for trace sinks: `hdr` serialised in front of the payload (no payload for
  /// control packets and trimmed data), as the fabric carried it before it carried structs.
  Ptr<Packet> ToPacket() const;

 private:
  friend struct PacketRecycler;
  static const PhantoraHeader& Blank() {
    static const PhantoraHeader blank;
    return blank;
  }

  PhantoraPacket* m_next = nullptr;  ///< on the free list
  static inline PhantoraPacket* s_free = nullptr;
};

inline void PacketRecycler::Delete(PhantoraPacket* p) {
  p->m_next = PhantoraPacket::s_free;
  PhantoraPacket::s_free = p;
}

}  // namespace ns3

#endif  // PHANTORA_PACKET_H
