// LoadBalancer: spraying, flowlets and adaptive choice among equal-cost ports.
#include "load-balancer.h"

#include <limits>
#include <stdexcept>

namespace ns3 {

LbMode ParseLbMode(const std::string& name) {
  if (name == "ecmp") {
    return LbMode::Ecmp;
  }
  if (name == "spray") {
    return LbMode::Spray;
  }
  if (name == "spray_rr") {
    return LbMode::SprayRr;
  }
  if (name == "flowlet") {
    return LbMode::Flowlet;
  }
  if (name == "adaptive") {
    return LbMode::Adaptive;
  }
  if (name == "reps") {
    return LbMode::Reps;
  }
  if (name == "oblivious") {
    return LbMode::Oblivious;
  }
  throw std::invalid_argument("switch attribute LoadBalancing: unknown mode '" + name +
                              "' (known: ecmp, spray, spray_rr, flowlet, adaptive, reps, oblivious)");
}

void LoadBalancer::Configure(LbMode mode, uint32_t node, Ptr<RouteTable> routes, uint64_t flowletGapNs, int64_t stream,
                             QueueQuery queueBytes) {
  m_mode = mode;
  m_node = node;
  m_routes = routes;
  m_gapNs = flowletGapNs;
  m_queueBytes = queueBytes;
  if (mode == LbMode::Spray) {
    m_rng = CreateObject<UniformRandomVariable>();
    m_rng->SetStream(stream);
  }
}

uint32_t LoadBalancer::Pick(const PhantoraHeader& hdr, uint64_t nowNs) {
  m_lastFlowlet = 0;
  if (m_mode == LbMode::Ecmp) {
    return m_routes->Pick(m_node, hdr.src, hdr.dst, hdr.ecmpKey, hdr.viaNic);
  }
  const std::vector<uint32_t>& c = m_routes->Candidates(m_node, hdr.dst);
  const uint32_t n = static_cast<uint32_t>(c.size());
  if (n == 0) {
    return std::numeric_limits<uint32_t>::max();
  }
  if (n == 1) {
    return c[0];
  }
  switch (m_mode) {
    case LbMode::Spray:
      return c[m_rng->GetInteger(0, n - 1)];
    case LbMode::SprayRr: {
      uint32_t& next = m_rr[hdr.dst];
      const uint32_t port = c[next % n];
      next = (next + 1) % n;
      return port;
    }
    case LbMode::Flowlet: {
      auto [it, fresh] = m_flowlet.try_emplace(hdr.flowId);
      Flowlet& f = it->second;
      if (fresh || nowNs - f.lastNs > m_gapNs) {
        f.number += fresh ? 0 : 1;
        f.port = c[EcmpHash(hdr.ecmpKey ^ (f.number * 0x9E3779B97F4A7C15ULL), m_node) % n];
        ++m_flowlets;
      }
      f.lastNs = nowNs;
      m_lastFlowlet = f.number;
      return f.port;
    }
    case LbMode::Adaptive: {
      const uint32_t first = static_cast<uint32_t>(EcmpHash(hdr.ecmpKey, m_node) % n);
      uint32_t best = c[first];
      uint64_t least = m_queueBytes(best);
      for (uint32_t i = 1; i < n && least > 0; ++i) {
        const uint32_t port = c[(first + i) % n];
        const uint64_t q = m_queueBytes(port);
        if (q < least) {
          least = q;
          best = port;
        }
      }
      return best;
    }
    case LbMode::Reps:
    case LbMode::Oblivious:  // the entropy value joins the flow key in the hash, as a UDP source port would
      return c[EcmpHash(hdr.ecmpKey ^ ((hdr.entropy + uint64_t{1}) * 0x9E3779B97F4A7C15ULL), m_node) % n];
    default:
      return m_routes->Pick(m_node, hdr.src, hdr.dst, hdr.ecmpKey, hdr.viaNic);
  }
}

void LoadBalancer::Dispose() {
  m_routes = nullptr;
  m_rng = nullptr;
  m_queueBytes.Nullify();
  m_flowlet.clear();
  m_rr.clear();
}

}  // namespace ns3
