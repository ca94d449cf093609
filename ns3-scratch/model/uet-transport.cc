// RudReceiver, RudSender and EntropyPicker: UET reliable unordered delivery and entropy choice (REPS).
#include "uet-transport.h"

#include "ns3/log.h"

#include <algorithm>
#include <bit>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraUetTransport");

RudReceiver::Arrival RudReceiver::Arrive(uint64_t seq, uint32_t len) {
  Arrival a;
  const uint64_t psn = seq / m_payload;
  if (psn < m_cumPsn || len == 0) {
    return a;  // a duplicate below the cumulative point
  }
  const uint64_t idx = psn - m_cumPsn;
  if (idx == 0 && m_held.empty()) {
    // In order with nothing held beyond (the common case): the cumulative point moves by this packet alone,
    // and the bitmap stays empty (m_bits is 0 whenever m_held is).
    m_cumBytes += len;
    ++m_cumPsn;
    a.fresh = a.advanced = true;
    return a;
  }
  if (idx >= m_held.size()) {
    m_held.resize(idx + 1, 0);
  }
  if (m_held[idx] != 0) {
    return a;
  }
  a.fresh = true;
  m_held[idx] = len;
  if (idx < kRudBitmapBits) {
    m_bits |= uint64_t{1} << idx;
  }
  uint64_t popped = 0;
  while (!m_held.empty() && m_held.front() != 0) {
    m_cumBytes += m_held.front();
    ++m_cumPsn;
    m_held.pop_front();
    ++popped;
  }
  if (popped > 0) {
    a.advanced = true;
    // The bitmap follows the cumulative point; the entries that moved into its top bits come from m_held.
    m_bits = popped >= kRudBitmapBits ? 0 : m_bits >> popped;
    const uint64_t n = std::min<uint64_t>(m_held.size(), kRudBitmapBits);
    for (uint64_t i = popped >= kRudBitmapBits ? 0 : kRudBitmapBits - popped; i < n; ++i) {
      if (m_held[i] != 0) {
        m_bits |= uint64_t{1} << i;
      }
    }
  }
  return a;
}

void RudSender::OnSend(uint64_t seq, uint32_t len, uint64_t nowNs, bool retx) {
  if (!retx) {
    Append(seq, len, nowNs);
    m_inFlight += len;
    m_sentEnd = std::max(m_sentEnd, seq + len);
    return;
  }
  if (Seg* g = Find(seq); g != nullptr && !g->acked) {
    g->sentNs = nowNs;
    g->retx = true;
    if (g->lost) {
      g->lost = false;
      m_inFlight += g->len;
      m_lostBytes -= g->len;
    }
  }
}

uint64_t RudSender::Ack(Seg& g) {
  if (g.acked) {
    return 0;
  }
  g.acked = true;
  ++m_ackedAhead;
  if (!g.lost) {
    m_inFlight -= g.len;
  } else {
    m_lostBytes -= g.len;
  }
  g.lost = false;
  return g.len;
}

void RudSender::MarkLost(uint64_t i) {
  Seg& g = m_segs[i];
  g.lost = true;
  m_inFlight -= g.len;
  m_lostBytes += g.len;
  QueueLost(SeqAt(i));
}

uint64_t RudSender::OnAck(uint64_t cum, uint64_t bitmap, uint64_t ackedSeq) {
  uint64_t newly = 0;
  Advance(cum, [this, &newly](Seg& g) {
    newly += Ack(g);
    --m_ackedAhead;  // acknowledged, and no longer ahead of the cumulative point
  });
  bitmap &= ~uint64_t{1};  // bit 0 is the cumulative point itself
  if (cum == m_base) {       // as usual after Advance: bit i is entry i
    while (bitmap != 0) {
      const auto i = static_cast<uint64_t>(std::countr_zero(bitmap));
      if (i >= m_segs.size()) {
        break;  // past the record: so are the higher bits
      }
      newly += Ack(m_segs[i]);
      bitmap &= bitmap - 1;
    }
  } else {
    while (bitmap != 0) {
      const auto i = static_cast<uint64_t>(std::countr_zero(bitmap));
      if (Seg* g = Find(cum + i * m_payload)) {
        newly += Ack(*g);
      }
      bitmap &= bitmap - 1;
    }
  }
  if (ackedSeq != UINT64_MAX) {
    if (Seg* g = Find(ackedSeq)) {
      newly += Ack(*g);
    }
  }
  return newly;
}

uint32_t RudSender::OnNack(uint64_t seq, uint64_t echoNs) {
  Seg* g = Find(seq);
  if (g == nullptr || g->acked || g->lost || g->sentNs != echoNs) {
    return 0;  // already received, already marked, or an older transmission's NACK
  }
  MarkLost((seq - m_base) / m_payload);
  return g->len;
}

uint64_t RudSender::OnTimeout(uint64_t nowNs, uint64_t rtoNs) {
  uint64_t marked = 0;
  for (uint64_t i = 0; i < m_segs.size(); ++i) {
    const Seg& g = m_segs[i];
    if (!g.acked && !g.lost && g.sentNs + rtoNs <= nowNs) {
      MarkLost(i);
      ++marked;
    }
  }
  return marked;
}

uint64_t RudSender::Sleek(uint64_t thresholdPackets, uint64_t windowBytes) {
  if (m_recovery && m_base >= m_recoveryEnd) {
    m_recovery = false;
  }
  if (!m_recovery) {
    if (m_ackedAhead < thresholdPackets) {
      return 0;
    }
    m_recovery = true;
    m_recoveryEnd = m_sentEnd;
    m_sleekNext = m_base;
  }
  uint64_t marked = 0;
  const uint64_t limit = std::min(m_recoveryEnd, m_base + windowBytes);
  for (uint64_t seq = std::max(m_sleekNext, m_base); seq < limit; seq += m_payload) {
    const uint64_t i = (seq - m_base) / m_payload;
    if (i >= m_segs.size()) {
      break;
    }
    m_sleekNext = seq + m_payload;
    if (!m_segs[i].acked && !m_segs[i].lost) {
      MarkLost(i);
      ++marked;
    }
  }
  return marked;
}

void RepsFreeze::Configure(uint32_t size, uint64_t freezeNs, uint32_t thawExplore) {
  m_size = std::max<uint32_t>(size, 1);
  m_freezeNs = freezeNs;
  m_thawExplore = thawExplore;
  m_good.clear();
  m_head = m_cursor = m_exploreLeft = 0;
  m_frozen = false;
}

bool RepsFreeze::OnTimeout(uint64_t nowNs) {
  if (m_freezeNs == 0 || m_frozen || m_exploreLeft > 0) {
    return false;
  }
  m_frozen = true;
  m_untilNs = nowNs + m_freezeNs;
  m_cursor = 0;
  ++m_freezes;
  NS_LOG_INFO("REPS freezes at " << nowNs << " ns until " << m_untilNs << " ns, cycling " << m_good.size()
                                 << " good entropies");
  return true;
}

bool RepsFreeze::OnFeedback(uint16_t entropy, bool good, uint64_t nowNs) {
  bool thawed = false;
  if (m_frozen && nowNs > m_untilNs) {
    m_frozen = false;
    m_good.clear();
    m_head = 0;
    m_exploreLeft = m_thawExplore;
    thawed = true;
    NS_LOG_INFO("REPS thaws at " << nowNs << " ns, exploring " << m_thawExplore << " entropies");
  }
  if (good) {
    if (m_good.size() < m_size) {
      m_good.push_back(entropy);
    } else {
      m_good[m_head] = entropy;  // the ring overwrites its oldest entry
    }
    if (++m_head == m_size) {
      m_head = 0;
    }
  }
  return thawed;
}

bool RepsFreeze::NextFrozen(uint16_t& entropy) {
  if (m_good.empty()) {
    return false;
  }
  entropy = m_good[m_cursor % m_good.size()];
  m_cursor = (m_cursor + 1) % m_good.size();
  return true;
}

bool RepsFreeze::TakeExplore() {
  if (m_exploreLeft == 0) {
    return false;
  }
  --m_exploreLeft;
  return true;
}

void EntropyPicker::Configure(EntropyMode mode, uint32_t entropies, uint32_t bufferSize,
                              Ptr<UniformRandomVariable> rng, RepsFreeze* freeze) {
  m_mode = mode;
  m_freeze = mode == EntropyMode::Reps ? freeze : nullptr;
  m_entropies = std::clamp<uint32_t>(entropies, 1, 65536);
  m_bufferSize = std::max<uint32_t>(bufferSize, 1);
  m_rng = rng;
  m_ring.assign(m_bufferSize, 0);
  m_ringHead = m_ringCount = 0;
  m_index = 0;
  m_xor = 0;
}

uint16_t EntropyPicker::Random() {
  ++m_explored;
  return static_cast<uint16_t>(m_rng->GetInteger(0, m_entropies - 1));
}

uint16_t EntropyPicker::Next() {
  switch (m_mode) {
    case EntropyMode::Reps:
      if (m_freeze != nullptr) {
        uint16_t ev = 0;
        if (m_freeze->TakeExplore()) {
          return Random();
        }
        if (m_freeze->Frozen()) {
          if (!m_freeze->NextFrozen(ev)) {
            return Random();
          }
          ++m_recycled;
          return ev;
        }
      }
      if (m_ringCount == 0) {
        return Random();
      } else {
        const uint16_t ev = m_ring[m_ringHead];  // the oldest
        m_ringHead = m_ringHead + 1 == m_bufferSize ? 0 : m_ringHead + 1;
        --m_ringCount;
        ++m_recycled;
        return ev;
      }
    case EntropyMode::Oblivious: {
      if (m_index == 0) {
        m_xor = m_rng->GetInteger(0, m_entropies - 1);
      }
      const uint16_t ev = static_cast<uint16_t>((m_index ^ m_xor) % m_entropies);
      m_index = (m_index + 1) % m_entropies;
      return ev;
    }
    default:
      return 0;
  }
}

void EntropyPicker::Feedback(uint16_t entropy, bool good, uint64_t nowNs) {
  if (m_mode != EntropyMode::Reps) {
    return;
  }
  if (m_freeze != nullptr && m_freeze->OnFeedback(entropy, good, nowNs)) {
    m_ringHead = m_ringCount = 0;  // thawed: what was recycled before is forgotten
  }
  if (!good) {
    return;
  }
  if (m_ringCount < m_bufferSize) {
    const uint32_t at = m_ringHead + m_ringCount;
    m_ring[at >= m_bufferSize ? at - m_bufferSize : at] = entropy;
    ++m_ringCount;
  } else {
    m_ring[m_ringHead] = entropy;  // full: the newest overwrites the oldest, which moves on
    m_ringHead = m_ringHead + 1 == m_bufferSize ? 0 : m_ringHead + 1;
  }
}

}  // namespace ns3
