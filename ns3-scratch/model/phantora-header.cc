// PhantoraHeader serialisation.
#include "phantora-header.h"
#include "phantora-type-id.h"

#include "ns3/log.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraHeader");
NS_OBJECT_ENSURE_REGISTERED(PhantoraHeader);

namespace {
constexpr uint32_t kFixedBytes = 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8;  // type/prio/flags/nHops, src, dst, ids ...
constexpr uint32_t kHopBytes = 8 + 8 + 4 + 8;
}  // namespace

TypeId PhantoraHeader::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraHeader, Header>("ns3::PhantoraHeader");
  return tid;
}

TypeId PhantoraHeader::GetInstanceTypeId() const { return GetTypeId(); }

uint32_t PhantoraHeader::GetSerializedSize() const {
  return kFixedBytes + 2 + ((flags & kFlagSack) ? 24 : 0) + (HasCredit() ? 8 : 0) + nHops * kHopBytes;
}

bool PhantoraHeader::HasCredit() const { return type == PktType::Credit || (flags & kFlagCredit); }

void PhantoraHeader::Serialize(Buffer::Iterator it) const {
  it.WriteU8(static_cast<uint8_t>(static_cast<uint8_t>(type) | (viaNic ? kTypeViaNic : 0)));
  it.WriteU8(prio);
  it.WriteU8(flags);
  it.WriteU8(nHops);
  it.WriteHtonU32(src);
  it.WriteHtonU32(dst);
  it.WriteHtonU64(flowId);
  it.WriteHtonU64(seq);
  it.WriteHtonU32(payload);
  it.WriteHtonU64(ecmpKey);
  it.WriteHtonU64(tsNs);
  it.WriteHtonU16(entropy);
  if (flags & kFlagSack) {
    it.WriteHtonU64(sackLo);
    it.WriteHtonU64(sackHi);
    it.WriteHtonU64(sackBitmap);
  }
  if (HasCredit()) {
    it.WriteHtonU64(credit);
  }
  for (uint32_t i = 0; i < nHops; ++i) {
    it.WriteHtonU64(hops[i].timeNs);
    it.WriteHtonU64(hops[i].txBytes);
    it.WriteHtonU32(hops[i].qlenBytes);
    it.WriteHtonU64(hops[i].lineRateBps);
  }
}

uint32_t PhantoraHeader::Deserialize(Buffer::Iterator it) {
  const uint8_t typeByte = it.ReadU8();
  type = static_cast<PktType>(typeByte & ~kTypeViaNic);
  viaNic = (typeByte & kTypeViaNic) != 0;
  prio = it.ReadU8();
  flags = it.ReadU8();
  nHops = it.ReadU8();
  if (nHops > kMaxIntHops) {
    nHops = kMaxIntHops;
  }
  src = it.ReadNtohU32();
  dst = it.ReadNtohU32();
  flowId = it.ReadNtohU64();
  seq = it.ReadNtohU64();
  payload = it.ReadNtohU32();
  ecmpKey = it.ReadNtohU64();
  tsNs = it.ReadNtohU64();
  entropy = it.ReadNtohU16();
  if (flags & kFlagSack) {
    sackLo = it.ReadNtohU64();
    sackHi = it.ReadNtohU64();
    sackBitmap = it.ReadNtohU64();
  }
  if (HasCredit()) {
    credit = it.ReadNtohU64();
  }
  for (uint32_t i = 0; i < nHops; ++i) {
    hops[i].timeNs = it.ReadNtohU64();
    hops[i].txBytes = it.ReadNtohU64();
    hops[i].qlenBytes = it.ReadNtohU32();
    hops[i].lineRateBps = it.ReadNtohU64();
  }
  return GetSerializedSize();
}

void PhantoraHeader::Print(std::ostream& os) const {
  static const char* names[] = {"DATA", "ACK", "NACK", "PFC", "CREDIT"};
  os << names[std::min(static_cast<int>(type), 4)] << " flow=" << flowId << " " << src << "->" << dst << " seq=" << seq
     << " len=" << payload << " prio=" << int(prio) << " flags=" << int(flags) << " hops=" << int(nHops)
     << (viaNic ? " via-nic" : "");
}

void PhantoraHeader::PushHop(const IntHop& hop) {
  if (nHops < kMaxIntHops) {
    hops[nHops++] = hop;
  }
}

}  // namespace ns3
