// The part of a selective sender's record that SackSender (sack-transport.h) and RudSender (uet-transport.h)
// share: one entry per packet in flight, found by sequence number, and the queue of packets marked lost.
#ifndef PHANTORA_PACKET_SCOREBOARD_H
#define PHANTORA_PACKET_SCOREBOARD_H

#include <cstdint>
#include <deque>

namespace ns3 {

/**
 * A flow's packets from the cumulative point on: entry i holds [Una() + i x payload, ... + len) (every packet but
 * the flow's last is full), with its last send time and whether it is acknowledged or marked lost. The loss rules
 * are the subclasses'; they queue what they mark, and NextLost() hands the queue out oldest first, skipping
 * entries acknowledged or resent since.
 */
class PacketScoreboard {
 public:
  /// The first byte not acknowledged cumulatively.
  uint64_t Una() const { return m_base; }
  /// Whether a lost packet waits for its resend (drops stale queue entries first).
  bool HasLost();
  /// The next lost packet to resend, if any: its seq and length.
  bool NextLost(uint64_t& seq, uint32_t& len);

 protected:
  struct Seg {
    uint32_t len = 0;
    uint64_t sentNs = 0;
    bool acked = false;
    bool lost = false;
    bool retx = false;  ///< sent more than once
  };

  /// The entry holding byte `seq` (nullptr if outside the record).
  Seg* Find(uint64_t seq);
  /// A first transmission [seq, seq + len) sent at `nowNs`: a new last entry (the first one sets Una()).
  void Append(uint64_t seq, uint32_t len, uint64_t nowNs);
  /// The cumulative point moved to `cum`: every entry wholly below it is dropped, `onDrop(entry)` called first.
  template <typename F>
  void Advance(uint64_t cum, F&& onDrop) {
    while (!m_segs.empty() && m_base + m_segs.front().len <= cum) {
      onDrop(m_segs.front());
      m_base += m_segs.front().len;
      m_segs.pop_front();
    }
    if (m_segs.empty() && cum > m_base) {
      m_base = cum;
    }
  }
  /// The seq of entry i.
  uint64_t SeqAt(uint64_t i) const { return m_base + i * m_payload; }
  /// Queue a packet just marked lost for its resend.
  void QueueLost(uint64_t seq) { m_lost.push_back(seq); }
  void ClearLost() { m_lost.clear(); }

  uint32_t m_payload = 1000;
  uint64_t m_base = 0;     ///< seq of m_segs.front()
  std::deque<Seg> m_segs;

 private:
  std::deque<uint64_t> m_lost;  ///< seqs marked lost, not yet resent (may be stale)
};

}  // namespace ns3

#endif  // PHANTORA_PACKET_SCOREBOARD_H
