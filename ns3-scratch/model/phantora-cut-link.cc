// PhantoraCutLink: cut cables, their messages, loopback windows.
#include "phantora-cut-link.h"

#include "phantora-channel.h"
#include "phantora-event.h"

#include "ns3/log.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>
#include <utility>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCutLink");

namespace {

/// Reads a batch field by field; throws when it runs out.
class Reader {
 public:
  Reader(const uint8_t* data, std::size_t size) : m_b(data), m_size(size) {}
  bool Done() const { return m_at == m_size; }
  std::size_t At() const { return m_at; }
  template <typename T>
  T Get() {
    Need(sizeof(T));
    return Next<T>();
  }
  /// Get() once Need() has checked the bytes (a message's fixed fields read after one check).
  template <typename T>
  [[gnu::always_inline]] T Next() {
    T v;
    std::memcpy(&v, m_b + m_at, sizeof(T));
    m_at += sizeof(T);
    return v;
  }
  void Need(std::size_t n) const {
    if (m_size - m_at < n) {
      throw std::invalid_argument("cut-link batch: truncated message at byte " + std::to_string(m_at));
    }
  }

 private:
  const uint8_t* m_b;
  std::size_t m_size;
  std::size_t m_at = 0;
};

/// Writer's refusal, out of line so that Put stays a compare and a copy.
[[noreturn, gnu::noinline, gnu::cold]] void WriterOverflow(std::size_t field, std::size_t reserved) {
  throw std::logic_error("cut-link message: a field of " + std::to_string(field) + " bytes past the " +
                         std::to_string(reserved) + " bytes reserved for it");
}

/// Appends fields to a region of known size, reserved at once (no per-field resize); throws rather than write
/// past it (a message whose fields outgrow the size it was given: a bug here, never memory corruption). The
/// outbox's buffer keeps its bytes past `len` from earlier windows: it grows (zero-filled) only past its largest.
class Writer {
 public:
  Writer(PhantoraCutLink::Outbox& out, std::size_t n) : m_n(n) {
    if (out.bytes.size() - out.len < n) [[unlikely]] {
      out.bytes.resize(std::max(out.len + n, out.bytes.size() * 2));
    }
    m_p = out.bytes.data() + out.len;
    m_end = m_p + n;
    out.len += n;
  }
  template <typename T>
  [[gnu::always_inline]] void Put(T v) {
    Need(sizeof(T));
    Next(v);
  }
  /// Throws unless `k` bytes are left: the fields put next, of `k` bytes in all, go by Next().
  [[gnu::always_inline]] void Need(std::size_t k) const {
    if (static_cast<std::size_t>(m_end - m_p) < k) [[unlikely]] {
      WriterOverflow(k, m_n);
    }
  }
  template <typename T>
  [[gnu::always_inline]] void Next(T v) {
    std::memcpy(m_p, &v, sizeof(T));
    m_p += sizeof(T);
  }
  /// Bytes reserved and not written.
  std::size_t Left() const { return static_cast<std::size_t>(m_end - m_p); }

 private:
  std::size_t m_n;
  uint8_t* m_p;
  uint8_t* m_end;
};

// A cut packet's header travels as its fields in native byte order, the same fields PhantoraHeader::Serialize
// writes (the optional ones under the same conditions), copied straight from and into the struct: no Buffer.
uint32_t HeaderBytes(const PhantoraHeader& h) { return h.GetSerializedSize(); }

void PutHeader(Writer& w, const PhantoraHeader& h) {
  w.Need(sizeof(uint8_t) * 4 + sizeof(uint32_t) * 3 + sizeof(uint64_t) * 4 + sizeof(uint16_t));
  w.Next(static_cast<uint8_t>(static_cast<uint8_t>(h.type) | (h.viaNic ? kTypeViaNic : 0)));
  w.Next(h.prio);
  w.Next(h.flags);
  w.Next(h.nHops);
  w.Next(h.src);
  w.Next(h.dst);
  w.Next(h.flowId);
  w.Next(h.seq);
  w.Next(h.payload);
  w.Next(h.ecmpKey);
  w.Next(h.tsNs);
  w.Next(h.entropy);
  if (h.flags & kFlagSack) {
    w.Need(sizeof(uint64_t) * 3);
    w.Next(h.sackLo);
    w.Next(h.sackHi);
    w.Next(h.sackBitmap);
  }
  if (h.HasCredit()) {
    w.Put(h.credit);
  }
  for (uint32_t i = 0; i < h.nHops; ++i) {
    w.Need(sizeof(uint64_t) * 3 + sizeof(uint32_t));
    w.Next(h.hops[i].timeNs);
    w.Next(h.hops[i].txBytes);
    w.Next(h.hops[i].qlenBytes);
    w.Next(h.hops[i].lineRateBps);
  }
}

/// Reads PutHeader's fields into `h`; throws when they do not take `len` bytes (checked once, from the fields
/// that say which optional ones follow, before the rest is read).
void GetHeader(Reader& r, uint32_t len, PhantoraHeader& h) {
  r.Need(std::max<uint32_t>(len, 4));
  const uint8_t typeByte = r.Next<uint8_t>();
  h.type = static_cast<PktType>(typeByte & ~kTypeViaNic);
  h.viaNic = (typeByte & kTypeViaNic) != 0;
  h.prio = r.Next<uint8_t>();
  h.flags = r.Next<uint8_t>();
  h.nHops = std::min<uint8_t>(r.Next<uint8_t>(), kMaxIntHops);
  if (h.GetSerializedSize() != len) {
    throw std::invalid_argument("cut-link batch: a packet header of " + std::to_string(h.GetSerializedSize()) +
                                " bytes where its message says " + std::to_string(len));
  }
  h.src = r.Next<uint32_t>();
  h.dst = r.Next<uint32_t>();
  h.flowId = r.Next<uint64_t>();
  h.seq = r.Next<uint64_t>();
  h.payload = r.Next<uint32_t>();
  h.ecmpKey = r.Next<uint64_t>();
  h.tsNs = r.Next<uint64_t>();
  h.entropy = r.Next<uint16_t>();
  if (h.flags & kFlagSack) {
    h.sackLo = r.Next<uint64_t>();
    h.sackHi = r.Next<uint64_t>();
    h.sackBitmap = r.Next<uint64_t>();
  }
  if (h.HasCredit()) {
    h.credit = r.Next<uint64_t>();
  }
  for (uint32_t i = 0; i < h.nHops; ++i) {
    h.hops[i].timeNs = r.Next<uint64_t>();
    h.hops[i].txBytes = r.Next<uint64_t>();
    h.hops[i].qlenBytes = r.Next<uint32_t>();
    h.hops[i].lineRateBps = r.Next<uint64_t>();
  }
}

}  // namespace

namespace {
/// Deliver's refusal of a note for a node of another worker (or with no handler), out of line.
[[noreturn, gnu::noinline, gnu::cold]] void NotOurs(const char* what, uint32_t node) {
  throw std::invalid_argument(std::string("cut-link batch: a ") + what + " message for node " +
                              std::to_string(node) + ", not this worker's");
}

constexpr uint32_t kForgetLink = UINT32_MAX;       ///< a batch message's cable field for "sender done"
constexpr uint32_t kReleaseLink = UINT32_MAX - 1;  ///< ... for "a dependency of this flow completed"
constexpr uint32_t kDoneLink = UINT32_MAX - 2;     ///< ... for "complete at its receiver"
constexpr uint32_t kBoundLink = UINT32_MAX - 3;    ///< ... for "completes at this ns or later"

constexpr std::size_t kNoteBytes = sizeof(uint64_t) * 2 + sizeof(uint32_t) * 2;  ///< a note's head
constexpr std::size_t kKeyBytes = sizeof(uint64_t) + sizeof(uint32_t) * 2;        ///< an order key
/// Releases of one event to one worker travel as one message (the releases of a completion's dependents come one
/// after the other, with one event key, one count of the events run and one start key but its count): a head of
/// (ns, kind, releases n, the event's key, seq, the start key's time and node), then n (node, flow, start count).
constexpr std::size_t kReleasesHead = sizeof(uint64_t) + sizeof(uint32_t) * 2 + kKeyBytes + sizeof(uint32_t) +
                                      sizeof(uint64_t) + sizeof(uint32_t);
constexpr std::size_t kReleaseEntry = sizeof(uint32_t) + sizeof(uint64_t) + sizeof(uint32_t);
constexpr std::size_t kReleasesCount = sizeof(uint64_t) + sizeof(uint32_t);  ///< where n is, in the head

/// The head of every message but a packet's: (ns, kind, node, flow).
void PutNote(Writer& w, uint32_t kind, uint64_t flow, uint32_t node, uint64_t ns) {
  w.Need(kNoteBytes);
  w.Next(ns);
  w.Next(kind);
  w.Next(node);
  w.Next(flow);
}

}  // namespace

PhantoraCutLink::PhantoraCutLink(Ptr<PhantoraFabric> fabric, const std::vector<uint32_t>& groups, uint32_t self,
                                 const std::vector<uint32_t>& idle)
    : m_fabric(fabric), m_groups(groups), m_self(self) {
  if (groups.size() != fabric->NumNodes()) {
    throw std::invalid_argument("partition.Groups: " + std::to_string(groups.size()) + " groups for " +
                                std::to_string(fabric->NumNodes()) + " nodes (one per node id)");
  }
  const uint32_t n = groups.empty() ? 0 : *std::max_element(groups.begin(), groups.end()) + 1;
  if (self != kLoopback && self >= n) {
    throw std::invalid_argument("partition.Worker: group " + std::to_string(self) + " of " + std::to_string(n));
  }
  m_outboxes.resize(n);
  std::vector<bool> idleNode(groups.size(), false);
  for (uint32_t v : idle) {
    if (v >= groups.size()) {
      throw std::invalid_argument("partition.Idle: node " + std::to_string(v) + " of " +
                                  std::to_string(groups.size()));
    }
    idleNode[v] = true;
  }
  const auto& links = fabric->Links();
  m_idleLink.assign(links.size(), false);
  for (uint32_t id = 0; id < links.size(); ++id) {
    const auto& l = links[id];
    if (groups[l.a] != groups[l.b]) {
      l.channel->SetCut(this, id);
      if (idleNode[l.a] || idleNode[l.b]) {
        m_idleLink[id] = true;  // no packet crosses it: its delay is no lookahead
        continue;
      }
      m_lookahead = m_cut == 0 ? l.delayNs : std::min(m_lookahead, l.delayNs);
      ++m_cut;
    }
  }
  if (m_cut > 0 && m_lookahead == 0) {
    throw std::invalid_argument("partition.Groups: a cut cable has no delay (the windows need a lookahead > 0)");
  }
  ComputeReach(m_idleLink);
}

void PhantoraCutLink::ComputeReach(const std::vector<bool>& idleLink) {
  // Dijkstra over each group's own cables, from every end of a cut cable that carries packets (at its delay),
  // with one extra vertex per group joined at 0 ns to the group's endpoints (a completion's release).
  const uint32_t n = static_cast<uint32_t>(m_groups.size());
  const uint32_t hubs = static_cast<uint32_t>(m_outboxes.size());
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> adj(n + hubs);
  std::vector<uint64_t> d(n + hubs, UINT64_MAX);
  const auto& links = m_fabric->Links();
  for (uint32_t id = 0; id < links.size(); ++id) {
    const auto& l = links[id];
    if (m_groups[l.a] == m_groups[l.b]) {
      adj[l.a].emplace_back(l.b, l.delayNs);
      adj[l.b].emplace_back(l.a, l.delayNs);
    } else if (!idleLink[id]) {
      d[l.a] = std::min(d[l.a], l.delayNs);
      d[l.b] = std::min(d[l.b], l.delayNs);
    }
  }
  for (uint32_t v = 0; v < n; ++v) {
    if (IsEndpoint(m_fabric->GetNode(v).kind)) {
      adj[v].emplace_back(n + m_groups[v], 0);
      adj[n + m_groups[v]].emplace_back(v, 0);
    }
  }
  using Entry = std::pair<uint64_t, uint32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> todo;
  for (uint32_t v = 0; v < n; ++v) {
    if (d[v] != UINT64_MAX) {
      todo.emplace(d[v], v);
    }
  }
  while (!todo.empty()) {
    const auto [dv, v] = todo.top();
    todo.pop();
    if (dv != d[v]) {
      continue;
    }
    for (const auto& [w, len] : adj[v]) {
      if (dv + len < d[w]) {
        d[w] = dv + len;
        todo.emplace(d[w], w);
      }
    }
  }
  d.resize(n);
  m_reach = std::move(d);
  m_ownReach = m_reach;
  for (uint32_t v = 0; v < n; ++v) {
    if (m_self != kLoopback && m_groups[v] != m_self) {
      m_ownReach[v] = std::min(m_ownReach[v], m_lookahead);
    }
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
  if (m_idleLink[link]) [[unlikely]] {
    throw std::logic_error("cut-link: a packet on cable " + std::to_string(link) +
                           ", whose end carries no packet (partition.Idle: NVLink is fluid)");
  }
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const PhantoraOrderKey key = sim->TakeKey();  // the key the direct path's arrival event would take
  const uint32_t hdrLen = HeaderBytes(pkt->hdr);
  const auto& l = m_fabric->Links()[link];
  Outbox& out = OutboxFor(toEnd == 0 ? l.a : l.b);
  m_minArrival = std::min(m_minArrival, arriveNs);
  const uint64_t reach = m_reach[toEnd == 0 ? l.a : l.b];
  m_minReach = std::min(m_minReach, reach > UINT64_MAX - arriveNs ? UINT64_MAX : arriveNs + reach);
  const std::size_t head = sizeof(arriveNs) + sizeof(link) + sizeof(uint8_t) + sizeof(key.schedTs) +
                           sizeof(key.node) + sizeof(key.count) + sizeof(epoch) + sizeof(pkt->linkCredit) +
                           sizeof(pkt->linkSent) + sizeof(pkt->linkClass) + sizeof(hdrLen);
  const PhantoraPacket& p = *pkt;
  Writer w(out, head + hdrLen);
  w.Need(head);
  w.Next(arriveNs);
  w.Next(link);
  w.Next(static_cast<uint8_t>(toEnd));
  w.Next(key.schedTs);
  w.Next(key.node);
  w.Next(key.count);
  w.Next(epoch);
  w.Next(p.linkCredit);
  w.Next(p.linkSent);
  w.Next(p.linkClass);
  w.Next(hdrLen);
  PutHeader(w, p.hdr);
  if (w.Left() != 0) [[unlikely]] {
    throw std::logic_error("cut-link message: " + std::to_string(w.Left()) + " of its bytes left unwritten (a "
                           "header of " + std::to_string(hdrLen) + " bytes)");
  }
  ++m_messages;
  m_bytes += head + hdrLen;
}

void PhantoraCutLink::OwnGroup(uint32_t node) const {
  throw std::logic_error("cut-link message to node " + std::to_string(node) + " of this worker's own group " +
                         std::to_string(m_groups[node]));
}

void PhantoraCutLink::SendNote(uint32_t kind, uint64_t flow, uint32_t node, uint64_t ns) {
  Writer w(OutboxFor(node), kNoteBytes);
  PutNote(w, kind, flow, node, ns);
  ++m_messages;
  m_bytes += kNoteBytes;
}

void PhantoraCutLink::SendForget(uint64_t flow, uint32_t node, uint64_t atNs) {
  SendNote(kForgetLink, flow, node, atNs);
}

void PhantoraCutLink::SendRelease(uint64_t flow, uint32_t node, uint64_t atNs, const PhantoraOrderKey& event,
                                  uint32_t seq, const PhantoraOrderKey& key, uint64_t landNs) {
  m_minArrival = std::min(m_minArrival, landNs);
  const uint64_t reach = m_reach.at(node);
  m_minReach = std::min(m_minReach, reach > UINT64_MAX - landNs ? UINT64_MAX : landNs + reach);
  Outbox& out = OutboxFor(node);
  Outbox::Releases& open = out.releases;
  const bool same = open.at != SIZE_MAX && open.end == out.len && open.ns == atNs && open.seq == seq &&
                    open.keyTs == key.schedTs && open.keyNode == key.node && open.event.schedTs == event.schedTs &&
                    open.event.node == event.node && open.event.count == event.count;
  std::size_t bytes = kReleaseEntry;
  if (same) {  // the message right before is this event's: one more release in it
    uint32_t n = 0;
    std::memcpy(&n, out.bytes.data() + open.at + kReleasesCount, sizeof(n));
    ++n;
    std::memcpy(out.bytes.data() + open.at + kReleasesCount, &n, sizeof(n));
  } else {
    bytes += kReleasesHead;
    open = Outbox::Releases{out.len, 0, atNs, event, seq, key.schedTs, key.node};
  }
  Writer w(out, bytes);  // one resize for the whole message (the head and the release, or the release)
  if (!same) {
    w.Need(kReleasesHead);
    w.Next(atNs);
    w.Next(kReleaseLink);
    w.Next(uint32_t{1});
    w.Next(event.schedTs);
    w.Next(event.node);
    w.Next(event.count);
    w.Next(seq);
    w.Next(key.schedTs);
    w.Next(key.node);
  }
  w.Need(kReleaseEntry);
  w.Next(node);
  w.Next(flow);
  w.Next(key.count);
  open.end = out.len;
  ++m_messages;
  ++m_releases;
  m_bytes += bytes;
}

void PhantoraCutLink::SendDone(uint64_t flow, uint32_t node, uint64_t atNs) {
  SendNote(kDoneLink, flow, node, atNs);
}

void PhantoraCutLink::SendBound(uint64_t flow, uint32_t node, uint64_t lbNs) {
  SendNote(kBoundLink, flow, node, lbNs);
}

std::vector<uint8_t> PhantoraCutLink::TakeOutbox(uint32_t group) {
  Outbox& box = m_outboxes.at(group);
  std::vector<uint8_t> out;
  box.bytes.resize(box.len);
  out.swap(box.bytes);
  box.len = 0;
  box.releases.at = SIZE_MAX;
  return out;
}

std::size_t PhantoraCutLink::SwapOutbox(uint32_t group, std::vector<uint8_t>& batch) {
  Outbox& box = m_outboxes.at(group);
  const std::size_t len = box.len;
  batch.swap(box.bytes);  // the old batch's buffer, written over from its start
  box.len = 0;
  box.releases.at = SIZE_MAX;
  return len;
}

uint64_t PhantoraCutLink::TakeMinArrival() {
  const uint64_t t = m_minArrival;
  m_minArrival = UINT64_MAX;
  return t;
}

uint64_t PhantoraCutLink::TakeMinReach() {
  const uint64_t t = m_minReach;
  m_minReach = UINT64_MAX;
  return t;
}

void PhantoraCutLink::Deliver(const std::vector<uint8_t>& batch) { Deliver(batch.data(), batch.size()); }

void PhantoraCutLink::Deliver(const uint8_t* data, std::size_t size) {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const auto& links = m_fabric->Links();
  Reader r(data, size);
  // The batch's packets are queued at once at its end (sorted and merged, not a wheel insert each), also when a
  // message is refused part way.
  struct Flush {
    PhantoraSimulatorImpl* sim;
    ~Flush() { sim->FlushStaged(); }
  } flush{sim};
  // A note on a flow (forget, bound, done, release): its (node, flow), for a node of this worker whose handler
  // (`handled`) is set, else the batch is malformed.
  auto note = [&r, this](const char* what, bool handled) {
    r.Need(sizeof(uint32_t) + sizeof(uint64_t));
    const auto node = r.Next<uint32_t>();
    const auto flow = r.Next<uint64_t>();
    if (node >= m_groups.size() || (m_self != kLoopback && m_groups[node] != m_self) || !handled) [[unlikely]] {
      NotOurs(what, node);
    }
    return std::pair<uint32_t, uint64_t>(node, flow);
  };
  while (!r.Done()) {
    const auto arriveNs = r.Get<uint64_t>();
    const auto link = r.Get<uint32_t>();
    if (link == kForgetLink) {
      const auto [node, flow] = note("sender-done", static_cast<bool>(m_forget));
      m_forget(flow, node, arriveNs);
      continue;
    }
    if (link == kBoundLink) {
      m_bound(note("bound", static_cast<bool>(m_bound)).second, arriveNs);
      continue;
    }
    if (link == kDoneLink) {
      m_done(note("done", static_cast<bool>(m_done)).second, arriveNs);
      continue;
    }
    if (link == kReleaseLink) {  // SendRelease's: the releases one event sent this worker
      r.Need(kReleasesHead - sizeof(uint64_t) - sizeof(uint32_t));
      const auto n = r.Next<uint32_t>();
      PhantoraOrderKey event, key;
      event.schedTs = r.Next<uint64_t>();
      event.node = r.Next<uint32_t>();
      event.count = r.Next<uint32_t>();
      const auto seq = r.Next<uint32_t>();
      key.schedTs = r.Next<uint64_t>();
      key.node = r.Next<uint32_t>();
      for (uint32_t i = 0; i < n; ++i) {
        const uint64_t flow = note("release", static_cast<bool>(m_release)).second;
        key.count = r.Get<uint32_t>();
        m_release(flow, arriveNs, event, seq, key);
      }
      continue;
    }
    // the rest of a packet's fixed fields (Send's), checked at once
    r.Need(sizeof(uint8_t) * 2 + sizeof(uint64_t) * 3 + sizeof(uint32_t) * 4);
    const auto toEnd = r.Next<uint8_t>();
    PhantoraOrderKey key;
    key.schedTs = r.Next<uint64_t>();
    key.node = r.Next<uint32_t>();
    key.count = r.Next<uint32_t>();
    const auto epoch = r.Next<uint64_t>();
    Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
    PhantoraPacket& fields = *pkt;
    fields.linkCredit = r.Next<uint32_t>();
    fields.linkSent = r.Next<uint64_t>();
    fields.linkClass = r.Next<uint8_t>();
    const auto hdrLen = r.Next<uint32_t>();
    GetHeader(r, hdrLen, fields.hdr);
    if (link >= links.size() || toEnd > 1) {
      throw std::invalid_argument("cut-link batch: message for cable " + std::to_string(link) + " end " +
                                  std::to_string(toEnd) + " (the fabric has " + std::to_string(links.size()) +
                                  " cables)");
    }
    const auto& l = links[link];
    PhantoraChannel* ch = PeekPointer(l.channel);
    const uint32_t node = toEnd == 0 ? l.a : l.b;
    if (m_self != kLoopback && m_groups[node] != m_self) {
      throw std::invalid_argument("cut-link batch: a message for node " + std::to_string(node) + " of group " +
                                  std::to_string(m_groups[node]) + " delivered to worker " + std::to_string(m_self));
    }
    if (arriveNs < sim->NowStep()) {
      throw std::runtime_error("cut-link message for node " + std::to_string(node) + " at " +
                               std::to_string(arriveNs) + " ns arrived behind its worker's clock (" +
                               std::to_string(sim->NowStep()) + " ns): a window ran too far");
    }
    auto arrive = [ch, end = static_cast<uint32_t>(toEnd), p = std::move(pkt), epoch] { ch->Arrive(end, p, epoch); };
    sim->StageKeyedAt(arriveNs, node, key, RecycledEvent<decltype(arrive)>::Arm(std::move(arrive)));
  }
}

void PhantoraCutLink::Barrier() {
  ++m_barriers;
  m_minArrival = UINT64_MAX;
  m_minReach = UINT64_MAX;
  for (uint32_t g = 0; g < m_outboxes.size(); ++g) {
    if (m_outboxes[g].len != 0) {
      Deliver(TakeOutbox(g));
    }
  }
}

}  // namespace ns3
