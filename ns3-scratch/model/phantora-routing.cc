// RouteTable: lazy BFS per destination, candidate ports ordered and chosen like the Python model.
#include "phantora-routing.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>
#include <tuple>

namespace ns3 {

namespace {
constexpr uint32_t kInf = 1u << 30;
const std::vector<uint32_t> kNoPorts;
}  // namespace

uint32_t Murmur3Words(const uint32_t* words, uint32_t n, uint32_t seed) {
  auto rotl = [](uint32_t x, int r) { return (x << r) | (x >> (32 - r)); };
  uint32_t h = seed;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t k = words[i] * 0xcc9e2d51u;
    k = rotl(k, 15) * 0x1b873593u;
    h = rotl(h ^ k, 13);
    h = h * 5 + 0xe6546b64u;
  }
  h ^= 4 * n;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

void RouteTable::ClearTables() {
  ++m_generation;
  m_dist.clear();
  m_hpccOrder.clear();
  m_cand.clear();
  m_candDone.clear();
  m_endpointCand.clear();
  m_endpointNicCand.clear();
}

void RouteTable::SetLinksDown(const std::vector<uint32_t>& links) {
  m_down.clear();
  uint32_t numLinks = 0;
  for (const auto& adj : m_adj) {
    for (const Adj& e : adj) {
      numLinks = std::max(numLinks, (e.channel >> 1) + 1);
    }
  }
  if (!links.empty()) {
    m_down.assign(numLinks, 0);
    for (uint32_t l : links) {
      if (l < numLinks) {
        m_down[l] = 1;
      }
    }
  }
  ClearTables();
}

void RouteTable::SetEcmpHash(EcmpHashKind kind) {
  m_hash = kind;
  ClearTables();
}

uint64_t RouteTable::ReverseKey(uint64_t key) const {
  if (m_hash != EcmpHashKind::Hpcc) {
    return key;
  }
  const uint64_t ports = key & 0xffffffffULL;
  return (key & ~0xffffffffULL) | ((ports & 0xffff) << 16) | (ports >> 16);
}

void RouteTable::AddNode(NodeKind kind) {
  m_kind.push_back(kind);
  m_adj.emplace_back();
  ClearTables();
}

std::pair<uint32_t, uint32_t> RouteTable::AddLink(uint32_t a, uint32_t b, uint32_t linkId) {
  const uint32_t pa = static_cast<uint32_t>(m_adj[a].size());
  const uint32_t pb = static_cast<uint32_t>(m_adj[b].size());
  m_adj[a].push_back({b, 2 * linkId, pa});
  m_adj[b].push_back({a, 2 * linkId + 1, pb});
  ClearTables();
  return {pa, pb};
}

const std::vector<uint32_t>& RouteTable::Dist(uint32_t dst) {
  if (m_dist.empty()) {
    m_dist.resize(m_kind.size());
  }
  std::vector<uint32_t>& dist = m_dist[dst];
  if (!dist.empty()) {
    return dist;
  }
  dist.assign(m_kind.size(), kInf);
  dist[dst] = 0;
  std::deque<uint32_t> queue{dst};
  while (!queue.empty()) {
    const uint32_t u = queue.front();
    queue.pop_front();
    if (u != dst && m_kind[u] != NodeKind::Switch) {
      continue;  // endpoints and NVSwitches are leaves of the search
    }
    for (const Adj& e : m_adj[u]) {
      if (dist[e.peer] == kInf && m_kind[e.peer] != NodeKind::NvSwitch && !LinkDown(e.channel)) {
        dist[e.peer] = dist[u] + 1;
        queue.push_back(e.peer);
      }
    }
  }
  return dist;
}

const std::vector<uint32_t>& RouteTable::HpccQueueOrder(uint32_t dst) {
  if (m_hpccOrder.empty()) {
    m_hpccOrder.resize(m_kind.size());
  }
  std::vector<uint32_t>& order = m_hpccOrder[dst];
  if (!order.empty()) {
    return order;
  }
  // third.cc CalculateRoute: neighbours in std::map<Ptr<Node>> (address) order, which on Linux puts
  // hosts first by id and switches by descending id; only switches are queued.
  order.assign(m_kind.size(), kInf);
  order[dst] = 0;
  std::vector<uint32_t> queue{dst};
  std::vector<std::pair<uint32_t, int64_t>> nbrs;  // (is switch, id or -id)
  for (size_t i = 0; i < queue.size(); ++i) {
    nbrs.clear();
    for (const Adj& e : m_adj[queue[i]]) {
      if (LinkDown(e.channel)) {
        continue;
      }
      const bool sw = m_kind[e.peer] == NodeKind::Switch;
      nbrs.emplace_back(sw ? 1 : 0, sw ? -static_cast<int64_t>(e.peer) : e.peer);
    }
    std::sort(nbrs.begin(), nbrs.end());
    for (const auto& [sw, signedId] : nbrs) {
      const uint32_t v = static_cast<uint32_t>(sw ? -signedId : signedId);
      if (sw && order[v] == kInf) {
        order[v] = static_cast<uint32_t>(queue.size());
        queue.push_back(v);
      }
    }
  }
  return order;
}

int64_t RouteTable::SharedNvSwitch(uint32_t a, uint32_t b) const {
  for (const Adj& eb : m_adj[b]) {
    if (m_kind[eb.peer] != NodeKind::NvSwitch || LinkDown(eb.channel)) {
      continue;
    }
    for (const Adj& ea : m_adj[a]) {
      if (ea.peer == eb.peer && !LinkDown(ea.channel)) {
        return eb.peer;
      }
    }
  }
  return -1;
}

uint32_t RouteTable::PortTo(uint32_t a, uint32_t b) const {
  for (const Adj& e : m_adj[a]) {
    if (e.peer == b && !LinkDown(e.channel)) {
      return e.port;
    }
  }
  return std::numeric_limits<uint32_t>::max();
}

bool RouteTable::Reachable(uint32_t src, uint32_t dst, bool viaNic) {
  if (src == dst) {
    return true;
  }
  if (!viaNic && SharedNvSwitch(src, dst) >= 0) {
    return true;
  }
  return Dist(dst)[src] < kInf;
}

const std::vector<uint32_t>& RouteTable::Candidates(uint32_t node, uint32_t dst) {
  if (IsEndpoint(m_kind[node])) {
    // Endpoints talk to few destinations: a hash map keeps large fabrics small.
    auto [it, fresh] = m_endpointCand.try_emplace((static_cast<uint64_t>(node) << 32) | dst);
    if (fresh) {
      FillCandidates(node, dst, it->second);
    }
    return it->second;
  }
  if (m_cand.empty()) {
    m_cand.resize(m_kind.size());
    m_candDone.resize(m_kind.size());
  }
  if (m_cand[node].empty()) {
    m_cand[node].resize(m_kind.size());
    m_candDone[node].assign(m_kind.size(), 0);
  }
  std::vector<uint32_t>& slot = m_cand[node][dst];
  if (!m_candDone[node][dst]) {
    m_candDone[node][dst] = 1;
    FillCandidates(node, dst, slot);
  }
  return slot;
}

const std::vector<uint32_t>& RouteTable::Candidates(uint32_t node, uint32_t dst, bool viaNic) {
  if (!viaNic || !IsEndpoint(m_kind[node])) {
    return Candidates(node, dst);
  }
  auto [it, fresh] = m_endpointNicCand.try_emplace((static_cast<uint64_t>(node) << 32) | dst);
  if (fresh) {
    FillCandidates(node, dst, it->second, true);
  }
  return it->second;
}

void RouteTable::FillCandidates(uint32_t node, uint32_t dst, std::vector<uint32_t>& out, bool viaNic) {
  const NodeKind kind = m_kind[node];
  out.clear();
  if (node == dst) {
    return;
  }
  if (kind == NodeKind::NvSwitch) {
    const uint32_t p = PortTo(node, dst);
    if (p != std::numeric_limits<uint32_t>::max()) {
      out.push_back(p);
    }
    return;
  }
  if (IsEndpoint(kind) && !viaNic) {
    const int64_t nv = SharedNvSwitch(node, dst);
    if (nv >= 0) {
      out.push_back(PortTo(node, static_cast<uint32_t>(nv)));
      return;
    }
  }
  const std::vector<uint32_t>& dist = Dist(dst);
  if (dist[node] >= kInf || dist[node] == 0) {
    return;
  }
  const uint32_t want = dist[node] - 1;
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> hops;  // (neighbour, channel, port)
  for (const Adj& e : m_adj[node]) {
    if (dist[e.peer] == want && (e.peer == dst || m_kind[e.peer] == NodeKind::Switch) && !LinkDown(e.channel)) {
      hops.emplace_back(e.peer, e.channel, e.port);
    }
  }
  std::sort(hops.begin(), hops.end());
  if (m_hash == EcmpHashKind::Hpcc && hops.size() > 1) {
    const std::vector<uint32_t>& order = HpccQueueOrder(dst);
    std::stable_sort(hops.begin(), hops.end(), [&order](const auto& a, const auto& b) {
      return order[std::get<0>(a)] < order[std::get<0>(b)];
    });
  }
  for (const auto& h : hops) {
    out.push_back(std::get<2>(h));
  }
}

uint32_t RouteTable::Choose(const std::vector<uint32_t>& c, uint32_t node, uint32_t src, uint32_t dst,
                            uint64_t key) const {
  if (c.empty()) {
    return std::numeric_limits<uint32_t>::max();
  }
  if (c.size() == 1) {
    return c[0];
  }
  if (m_hash == EcmpHashKind::Hpcc) {
    return c[HpccEcmpHash(src, dst, key, node) % c.size()];
  }
  return c[EcmpHash(key, node) % c.size()];
}

uint32_t RouteTable::Pick(uint32_t node, uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  return Choose(Candidates(node, dst, viaNic), node, src, dst, key);
}

std::vector<int64_t> RouteTable::Path(uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  std::vector<int64_t> path;
  uint32_t node = src;
  while (node != dst) {
    const uint32_t port = Pick(node, src, dst, key, viaNic);
    if (port == std::numeric_limits<uint32_t>::max() || path.size() > m_kind.size()) {
      return {};
    }
    const Adj& e = m_adj[node][port];
    path.push_back(e.channel);
    node = e.peer;
  }
  return path;
}

bool RouteTable::PathInto(uint32_t src, uint32_t dst, uint64_t key, bool viaNic, std::vector<uint32_t>& channels) {
  channels.clear();
  uint32_t node = src;
  while (node != dst) {
    uint32_t port;
    if (IsEndpoint(m_kind[node])) {
      FillCandidates(node, dst, m_scratch, viaNic);  // an endpoint's ports, not kept
      port = Choose(m_scratch, node, src, dst, key);
    } else {
      port = Pick(node, src, dst, key, viaNic);
    }
    if (port == std::numeric_limits<uint32_t>::max() || channels.size() > m_kind.size()) {
      channels.clear();
      return false;
    }
    const Adj& e = m_adj[node][port];
    channels.push_back(e.channel);
    node = e.peer;
  }
  return true;
}

}  // namespace ns3
