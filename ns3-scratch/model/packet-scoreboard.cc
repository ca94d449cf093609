// PacketScoreboard: entries by sequence number and the queue of lost packets.
#include "packet-scoreboard.h"

namespace ns3 {

PacketScoreboard::Seg* PacketScoreboard::Find(uint64_t seq) {
  if (seq < m_base) {
    return nullptr;
  }
  const uint64_t idx = (seq - m_base) / m_payload;
  return idx < m_segs.size() ? &m_segs[idx] : nullptr;
}

void PacketScoreboard::Append(uint64_t seq, uint32_t len, uint64_t nowNs) {
  if (m_segs.empty()) {
    m_base = seq;
  }
  m_segs.push_back(Seg{len, nowNs, false, false, false});
}

bool PacketScoreboard::HasLost() {
  while (!m_lost.empty()) {
    const Seg* g = Find(m_lost.front());
    if (g != nullptr && g->lost && !g->acked) {
      return true;
    }
    m_lost.pop_front();
  }
  return false;
}

bool PacketScoreboard::NextLost(uint64_t& seq, uint32_t& len) {
  if (!HasLost()) {
    return false;
  }
  seq = m_lost.front();
  len = Find(seq)->len;
  m_lost.pop_front();
  return true;
}

}  // namespace ns3
