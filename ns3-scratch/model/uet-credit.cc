// CreditPacer: the receiving port's round robin of credit grants (UET RCCC).
#include "uet-credit.h"

namespace ns3 {

void CreditPacer::Queue(uint64_t flow, State& s) {
  if (!s.queued && s.target > s.granted) {
    s.queued = true;
    m_turn.push_back(flow);
  }
}

void CreditPacer::Ask(uint64_t flow, uint64_t target) {
  State& s = m_flows[flow];
  s.target = std::max(s.target, target);
  Queue(flow, s);
}

void CreditPacer::Add(uint64_t flow, uint64_t bytes) {
  State& s = m_flows[flow];
  s.target = std::max(s.target, s.granted) + bytes;
  Queue(flow, s);
}

bool CreditPacer::Next(uint64_t quantum, uint64_t& flow, uint64_t& cumulative, uint64_t& bytes) {
  while (!m_turn.empty()) {
    const uint64_t id = m_turn.front();
    m_turn.pop_front();
    auto it = m_flows.find(id);
    if (it == m_flows.end()) {
      continue;  // forgotten (finished) while waiting
    }
    State& s = it->second;
    s.queued = false;
    if (s.target <= s.granted) {
      continue;
    }
    bytes = std::min(quantum, s.target - s.granted);
    s.granted += bytes;
    flow = id;
    cumulative = s.granted;
    Queue(id, s);  // back of the turn if it wants more
    return true;
  }
  return false;
}

}  // namespace ns3
