// A packet of the phantora fabric: its header as a struct, read and changed in place at every hop.
#ifndef PHANTORA_PACKET_H
#define PHANTORA_PACKET_H

#include "phantora-header.h"
#include "phantora-pool.h"

#include "ns3/packet.h"
#include "ns3/ptr.h"
#include "ns3/simple-ref-count.h"

#include <vector>

namespace ns3 {

/**
 * What travels through the devices, channels and queues of the fabric. Every device and channel is
 * ours, so the header never goes through a byte buffer: a switch reads `hdr` as it is and marks CE, stamps
 * INT or trims in place. The bytes a packet occupies on the wire are WireFormat's, as before. Made from a
 * free list (no malloc per packet).
 *
 * Layout (a packet is cold whenever a hop reaches it: it left the previous port a link delay ago): aligned to a
 * cache line, with the reference count, `linkCredit` and the header's fields up to `viaNic` in its first 64
 * bytes, so a switch hop touches that line only; the send time and SACK fields are on the second, the INT
 * records after them. The free list is a stack of pointers, not a link inside the packet.
 */
class PhantoraPacket;

/// SimpleRefCount's deleter for PhantoraPacket: the last reference puts the packet on a free list (not
/// destroyed: the header's ns-3 base classes cost a constructor and destructor call chain per packet).
struct PacketRecycler {
  static void Delete(PhantoraPacket* p);
};

class alignas(64) PhantoraPacket : public SimpleRefCount<PhantoraPacket, Empty, PacketRecycler> {
 public:
  PHANTORA_POOLED(PhantoraPacket)

  /// A packet with a default header (as Create<PhantoraPacket>()), from the free list when it has one.
  static Ptr<PhantoraPacket> Make() {
    std::vector<PhantoraPacket*>& free = FreeList();
    if (free.empty()) {
      return Create<PhantoraPacket>();
    }
    PhantoraPacket* p = free.back();
    free.pop_back();
    p->hdr.ResetFields();  // every field as a new packet's (INT records past nHops = 0 are never read)
    p->linkCredit = 0;
    p->linkSent = 0;
    p->linkClass = 0;
    return Ptr<PhantoraPacket>(p);  // SimpleRefCount left its count at 0: this reference makes it 1
  }

  /// Link credit (credit-based flow control): the bytes of class `linkClass` credit the sending port spent on
  /// this packet, which the receiving switch returns when the packet leaves its buffer; 0 = none spent. Set by
  /// the sending PhantoraNetDevice for each hop (link-layer bookkeeping, no wire bytes of its own), read by every
  /// switch: beside the reference count. `linkSent`: the port's cumulative credited bytes of that class, this
  /// packet included (InfiniBand's FCTBS): the receiver gives back the credit of packets the link lost in between.
  uint32_t linkCredit = 0;
  PhantoraHeader hdr;
  uint64_t linkSent = 0;
  uint8_t linkClass = 0;

  /// The packet as an ns-3 Packet, for trace sinks: `hdr` serialised in front of the payload (no payload for
  /// control packets and trimmed data), as the fabric carried it before it carried structs.
  Ptr<Packet> ToPacket() const;

 private:
  friend struct PacketRecycler;
  /// Packets whose last reference went, most recent last (taken first: the likeliest still in cache).
  static std::vector<PhantoraPacket*>& FreeList() {
    static auto* free = new std::vector<PhantoraPacket*>();  // never destroyed: packets outlive static teardown
    return *free;
  }
};

inline void PacketRecycler::Delete(PhantoraPacket* p) { PhantoraPacket::FreeList().push_back(p); }

}  // namespace ns3

#endif  // PHANTORA_PACKET_H
