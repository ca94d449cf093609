// SackReceiver and SackSender: received ranges, the sender's scoreboard, RACK-style loss detection.
#include "sack-transport.h"

#include <algorithm>
#include <iterator>

namespace ns3 {

SackReceiver::Arrival SackReceiver::Arrive(uint64_t seq, uint32_t len) {
  Arrival a;
  const uint64_t hi = seq + len;
  if (hi <= m_cum) {
    return a;  // a duplicate below the cumulative point
  }
  const uint64_t lo = std::max(seq, m_cum);
  uint64_t newLo = lo;
  uint64_t newHi = hi;
  uint64_t overlap = 0;
  auto it = m_blocks.upper_bound(lo);
  if (it != m_blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= lo) {
      it = prev;  // touches or overlaps the new range
    }
  }
  while (it != m_blocks.end() && it->first <= hi) {
    const uint64_t olo = std::max(it->first, lo);
    const uint64_t ohi = std::min(it->second, hi);
    overlap += ohi > olo ? ohi - olo : 0;
    newLo = std::min(newLo, it->first);
    newHi = std::max(newHi, it->second);
    m_buffered -= it->second - it->first;
    it = m_blocks.erase(it);
  }
  a.newBytes = (hi - lo) - overlap;
  if (newLo <= m_cum) {
    m_cum = newHi;
    a.advanced = true;
    return a;
  }
  m_blocks.emplace(newLo, newHi);
  m_buffered += newHi - newLo;
  a.blockLo = newLo;
  a.blockHi = newHi;
  return a;
}

void SackSender::OnSend(uint64_t seq, uint32_t len, uint64_t nowNs, bool retx) {
  if (!retx) {
    Append(seq, len, nowNs);
    return;
  }
  if (Seg* s = Find(seq)) {
    s->sentNs = nowNs;
    s->lost = false;
    s->retx = true;
  }
}

uint64_t SackSender::OnAck(uint64_t cum, uint64_t lo, uint64_t hi, uint64_t echoNs) {
  uint64_t newly = 0;
  Advance(cum, [&newly](const Seg& g) { newly += g.acked ? 0 : g.len; });
  for (uint64_t s = std::max(lo, m_base); s < hi; s += m_payload) {
    Seg* g = Find(s);
    if (g == nullptr) {
      break;
    }
    if (!g->acked) {
      g->acked = true;
      g->lost = false;
      newly += g->len;
    }
  }
  m_rackNs = std::max(m_rackNs, echoNs);
  DetectLosses();
  return newly;
}

void SackSender::DetectLosses() {
  for (uint64_t i = 0; i < m_segs.size(); ++i) {
    Seg& g = m_segs[i];
    if (g.acked || g.lost) {
      continue;
    }
    if (g.sentNs + m_windowNs >= m_rackNs) {
      if (!g.retx) {
        break;  // first transmissions leave in seq order: every later one is more recent still
      }
      continue;
    }
    g.lost = true;
    QueueLost(SeqAt(i));
  }
}

void SackSender::OnTimeout() {
  ClearLost();
  for (uint64_t i = 0; i < m_segs.size(); ++i) {
    Seg& g = m_segs[i];
    if (!g.acked) {
      g.lost = true;
      QueueLost(SeqAt(i));
    }
  }
}

}  // namespace ns3
