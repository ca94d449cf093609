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

SackSender::Seg* SackSender::Find(uint64_t seq) {
  if (seq < m_base) {
    return nullptr;
  }
  const uint64_t idx = (seq - m_base) / m_payload;
  return idx < m_segs.size() ? &m_segs[idx] : nullptr;
}

void SackSender::OnSend(uint64_t seq, uint32_t len, uint64_t nowNs, bool retx) {
  if (!retx) {
    if (m_segs.empty()) {
      m_base = seq;
    }
    m_segs.push_back(Seg{len, nowNs, false, false, false});
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
  while (!m_segs.empty() && m_base + m_segs.front().len <= cum) {
    if (!m_segs.front().acked) {
      newly += m_segs.front().len;
    }
    m_base += m_segs.front().len;
    m_segs.pop_front();
  }
  if (m_segs.empty() && cum > m_base) {
    m_base = cum;
  }
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
    m_lost.push_back(m_base + i * m_payload);
  }
}

void SackSender::OnTimeout() {
  m_lost.clear();
  for (uint64_t i = 0; i < m_segs.size(); ++i) {
    Seg& g = m_segs[i];
    if (!g.acked) {
      g.lost = true;
      m_lost.push_back(m_base + i * m_payload);
    }
  }
}

bool SackSender::HasLost() {
  while (!m_lost.empty()) {
    const Seg* g = Find(m_lost.front());
    if (g != nullptr && g->lost && !g->acked) {
      return true;
    }
    m_lost.pop_front();
  }
  return false;
}

bool SackSender::NextLost(uint64_t& seq, uint32_t& len) {
  if (!HasLost()) {
    return false;
  }
  seq = m_lost.front();
  len = Find(seq)->len;
  m_lost.pop_front();
  return true;
}

}  // namespace ns3
