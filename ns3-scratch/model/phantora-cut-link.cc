// PhantoraCutLink: cut cables, their messages, loopback windows.
#include "phantora-cut-link.h"

#include "phantora-channel.h"
#include "phantora-event.h"

#include "ns3/buffer.h"
#include "ns3/log.h"

#include <cstring>
#include <stdexcept>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCutLink");

namespace {

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

/// Reads a batch field by field; throws when it runs out.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : m_b(b) {}
  bool Done() const { return m_at == m_b.size(); }
  template <typename T>
  T Get() {
    T v;
    Need(sizeof(T));
    std::memcpy(&v, m_b.data() + m_at, sizeof(T));
    m_at += sizeof(T);
    return v;
  }
  const uint8_t* Bytes(std::size_t n) {
    Need(n);
    const uint8_t* p = m_b.data() + m_at;
    m_at += n;
    return p;
  }

 private:
  void Need(std::size_t n) const {
    if (m_b.size() - m_at < n) {
      throw std::invalid_argument("cut-link batch: truncated message at byte " + std::to_string(m_at));
    }
  }
  const std::vector<uint8_t>& m_b;
  std::size_t m_at = 0;
};

}  // namespace

PhantoraCutLink::PhantoraCutLink(Ptr<PhantoraFabric> fabric, const std::vector<uint32_t>& groups) : m_fabric(fabric) {
  if (groups.size() != fabric->NumNodes()) {
    throw std::invalid_argument("partition.Groups: " + std::to_string(groups.size()) + " groups for " +
                                std::to_string(fabric->NumNodes()) + " nodes (one per node id)");
  }
  const auto& links = fabric->Links();
  for (uint32_t id = 0; id < links.size(); ++id) {
    const auto& l = links[id];
    if (groups[l.a] != groups[l.b]) {
      l.channel->SetCut(this, id);
      m_lookahead = m_cut == 0 ? l.delayNs : std::min(m_lookahead, l.delayNs);
      ++m_cut;
    }
  }
  if (m_cut > 0 && m_lookahead == 0) {
    throw std::invalid_argument("partition.Groups: a cut cable has no delay (the windows need a lookahead > 0)");
  }
}

PhantoraCutLink::~PhantoraCutLink() {
  for (const auto& l : m_fabric->Links()) {
    if (l.channel) {
      l.channel->SetCut(nullptr, 0);
    }
  }
}

void PhantoraCutLink::Send(uint32_t link, uint32_t toEnd, const Ptr<PhantoraPacket>& pkt, uint64_t arriveNs,
                           uint64_t epoch) {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const PhantoraOrderKey key = sim->TakeKey();  // the key the direct path's arrival event would take
  const uint32_t hdrLen = pkt->hdr.GetSerializedSize();
  const std::size_t start = m_outbox.size();
  Put(m_outbox, arriveNs);
  Put(m_outbox, link);
  Put(m_outbox, static_cast<uint8_t>(toEnd));
  Put(m_outbox, key.schedTs);
  Put(m_outbox, key.node);
  Put(m_outbox, key.count);
  Put(m_outbox, epoch);
  Put(m_outbox, pkt->linkCredit);
  Put(m_outbox, pkt->linkSent);
  Put(m_outbox, pkt->linkClass);
  Put(m_outbox, hdrLen);
  Buffer buf;
  buf.AddAtStart(hdrLen);
  pkt->hdr.Serialize(buf.Begin());
  const std::size_t at = m_outbox.size();
  m_outbox.resize(at + hdrLen);
  buf.CopyData(m_outbox.data() + at, hdrLen);
  ++m_messages;
  m_bytes += m_outbox.size() - start;
}

std::vector<uint8_t> PhantoraCutLink::TakeOutbox() {
  std::vector<uint8_t> out;
  out.swap(m_outbox);
  return out;
}

void PhantoraCutLink::Deliver(const std::vector<uint8_t>& batch) {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const auto& links = m_fabric->Links();
  Reader r(batch);
  while (!r.Done()) {
    const auto arriveNs = r.Get<uint64_t>();
    const auto link = r.Get<uint32_t>();
    const auto toEnd = r.Get<uint8_t>();
    PhantoraOrderKey key;
    key.schedTs = r.Get<uint64_t>();
    key.node = r.Get<uint32_t>();
    key.count = r.Get<uint32_t>();
    const auto epoch = r.Get<uint64_t>();
    Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
    pkt->linkCredit = r.Get<uint32_t>();
    pkt->linkSent = r.Get<uint64_t>();
    pkt->linkClass = r.Get<uint8_t>();
    const auto hdrLen = r.Get<uint32_t>();
    const uint8_t* bytes = r.Bytes(hdrLen);
    if (link >= links.size() || toEnd > 1) {
      throw std::invalid_argument("cut-link batch: message for cable " + std::to_string(link) + " end " +
                                  std::to_string(toEnd) + " (the fabric has " + std::to_string(links.size()) +
                                  " cables)");
    }
    Buffer buf;
    buf.AddAtStart(hdrLen);
    buf.Begin().Write(bytes, hdrLen);
    pkt->hdr.Deserialize(buf.Begin());
    const auto& l = links[link];
    PhantoraChannel* ch = PeekPointer(l.channel);
    const uint32_t node = toEnd == 0 ? l.a : l.b;
    if (arriveNs < sim->NowStep()) {
      throw std::runtime_error("cut-link message for node " + std::to_string(node) + " at " +
                               std::to_string(arriveNs) + " ns arrived behind its worker's clock (" +
                               std::to_string(sim->NowStep()) + " ns): a window ran too far");
    }
    auto arrive = [ch, end = static_cast<uint32_t>(toEnd), p = pkt, epoch] { ch->Arrive(end, p, epoch); };
    sim->ScheduleKeyedAt(arriveNs, node, key, RecycledEvent<decltype(arrive)>::Arm(std::move(arrive)));
  }
}

void PhantoraCutLink::Barrier() {
  ++m_barriers;
  if (!m_outbox.empty()) {
    Deliver(TakeOutbox());
  }
}

}  // namespace ns3
