// What a network keeps of its finished flows for the whole run, a bit a flow where it can (issue 38: a live run's
// network server grew about 300 bytes a flow).
#ifndef PHANTORA_FINISHED_FLOWS_H
#define PHANTORA_FINISHED_FLOWS_H

#include "id-bits.h"
#include "sack-transport.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>

namespace ns3 {

/**
 * The flows complete at their receiver: each one's completion ns while it may still be asked (a partition worker's
 * bounds read it), then, once Forget says it is done at both ends, a bit: a dependency on such a flow, which ended
 * before now, waits for nothing. find / operator[] see the ns kept; count sees both.
 */
class DoneEnds {
 public:
  using Map = std::unordered_map<uint64_t, int64_t>;
  Map::iterator find(uint64_t id) { return m_ns.find(id); }
  Map::const_iterator find(uint64_t id) const { return m_ns.find(id); }
  Map::iterator end() { return m_ns.end(); }
  Map::const_iterator end() const { return m_ns.end(); }
  int64_t& operator[](uint64_t id) { return m_ns[id]; }
  std::size_t count(uint64_t id) const { return m_ns.count(id) || m_done.Has(id) ? 1 : 0; }
  /// Done at both ends (Forget): its ns no longer kept.
  bool Forgotten(uint64_t id) const { return m_done.Has(id); }
  /// Keep only a bit of `id` (an id IdBits cannot hold keeps its ns).
  void Forget(uint64_t id) {
    const auto it = m_ns.find(id);
    if (it != m_ns.end() && m_done.Insert(id)) {
      m_ns.erase(it);
    }
  }

 private:
  Map m_ns;
  IdBits m_done;
};

/**
 * Each flow's transport counters (flows.csv's retransmission and reordering columns), by id. A flow whose counters
 * are final and all 0 (Final: every flow of a lossless fabric) is a bit; iteration merges the two in id order, each
 * element a (id, counters) pair.
 */
class TransportTable {
 public:
  /// The counters kept of `id` as a record, or nullptr (none, or all 0 and final).
  FlowTransportStats* Find(uint64_t id) {
    const auto it = m_map.find(id);
    return it == m_map.end() ? nullptr : &it->second;
  }
  FlowTransportStats& operator[](uint64_t id) { return m_map[id]; }
  /// `id`'s counters are final: all 0, they become a bit.
  void Final(uint64_t id) {
    const auto it = m_map.find(id);
    if (it == m_map.end()) {
      return;
    }
    const FlowTransportStats& c = it->second;
    if (!c.retxPackets && !c.retxBytes && !c.oooPackets && !c.reorderMaxBytes && m_zero.Insert(id)) {
      m_map.erase(it);
    }
  }
  std::size_t size() const { return m_map.size() + m_zero.Size(); }

  class Iterator {
   public:
    Iterator(const TransportTable& t, bool atEnd)
        : m_it(atEnd ? t.m_map.end() : t.m_map.begin()), m_end(t.m_map.end()), m_zero(&t.m_zero),
          m_bit(atEnd ? UINT64_MAX : t.m_zero.NextFrom(0)) {}
    std::pair<uint64_t, FlowTransportStats> operator*() const {
      if (FromBits()) {
        return {m_bit, FlowTransportStats{}};
      }
      return *m_it;
    }
    Iterator& operator++() {
      if (FromBits()) {
        m_bit = m_zero->NextFrom(m_bit + 1);  // (ids held are below IdBits::kLimit)
      } else {
        ++m_it;
      }
      return *this;
    }
    bool operator==(const Iterator& o) const { return m_it == o.m_it && m_bit == o.m_bit; }

   private:
    bool FromBits() const { return m_bit != UINT64_MAX && (m_it == m_end || m_bit < m_it->first); }
    std::map<uint64_t, FlowTransportStats>::const_iterator m_it, m_end;
    const IdBits* m_zero;
    uint64_t m_bit;  ///< the next id of m_zero, UINT64_MAX once past the last
  };
  Iterator begin() const { return Iterator(*this, false); }
  Iterator end() const { return Iterator(*this, true); }

 private:
  std::map<uint64_t, FlowTransportStats> m_map;
  IdBits m_zero;
};

}  // namespace ns3

#endif  // PHANTORA_FINISHED_FLOWS_H
