// UET receiver-credit congestion control (RCCC): the sender's credit of one message and the receiving port's
// pacer that hands credit out. The NIC (rdma-nic) carries requests on data packets and grants on Credit packets.
#ifndef PHANTORA_UET_CREDIT_H
#define PHANTORA_UET_CREDIT_H

#include <algorithm>
#include <cstdint>
#include <deque>
#include <unordered_map>

namespace ns3 {

/**
 * What a sender may send of one message under receiver credits. It starts with a speculative allowance (its
 * first round trip); the first ACK or grant ends speculation (what was not spent of it is dropped). Grants are
 * cumulative (the receiver's running total), so a lost or reordered grant costs nothing. A packet may leave
 * while any credit is left (it may overdraw by less than a packet). Every data packet asks for a cumulative
 * grant, Target(): enough for the bytes still to send, new and resent, but never more than `maxCredit` (or,
 * under a sender window too, the window and one packet) ahead of what it has spent.
 */
class CreditLedger {
 public:
  void Configure(uint64_t speculative, uint64_t maxCredit, uint32_t mtu) {
    m_allowance = std::max<uint64_t>(speculative, mtu);  // at least one packet, or nothing would ever ask
    m_maxCredit = std::max<uint64_t>(maxCredit, mtu);
    m_mtu = mtu;
  }
  bool CanSend() const { return m_spent < m_allowance + m_granted; }
  void OnSend(uint32_t bytes) { m_spent += bytes; }
  /// A grant: the receiver's cumulative credit for this message (ends speculation).
  void OnGrant(uint64_t cumulative) {
    StopSpeculating();
    m_granted = std::max(m_granted, cumulative);
  }
  /// The first feedback from the receiver: the speculative allowance not spent yet is dropped.
  void StopSpeculating() {
    if (m_speculating) {
      m_speculating = false;
      m_allowance = std::min(m_allowance, m_spent);
    }
  }
  /// Allow `bytes` without a grant (after a retransmission timeout, for UET's request to send).
  void Allow(uint64_t bytes) { m_allowance += bytes; }
  /// The cumulative grant to ask for, with `backlog` bytes still to send and a sender window (0 = none).
  uint64_t Target(uint64_t backlog, uint64_t window) const {
    const uint64_t cap = window == 0 ? m_maxCredit : std::min(m_maxCredit, window + m_mtu);
    const uint64_t want = m_spent + std::min(backlog, cap);
    return want > m_allowance ? want - m_allowance : 0;
  }
  uint64_t Spent() const { return m_spent; }
  uint64_t Granted() const { return m_granted; }

 private:
  uint64_t m_allowance = 0;  ///< bytes allowed without a grant
  uint64_t m_granted = 0;    ///< the receiver's cumulative grant
  uint64_t m_spent = 0;      ///< payload bytes sent, first transmissions and resends
  uint64_t m_maxCredit = 0;
  uint32_t m_mtu = 1000;
  bool m_speculating = true;
};

/**
 * The credit a receiving port hands out, one grant of at most a quantum at a time, to the messages that asked
 * for more than they were granted, in turn (round robin); the NIC paces the grants at the port's rate, so the
 * senders together send what the port can take.
 */
class CreditPacer {
 public:
  /// Message `flow` asks for a cumulative grant of `target` (a smaller one than before changes nothing).
  void Ask(uint64_t flow, uint64_t target);
  /// Message `flow` needs `bytes` more than it asked for (a trimmed packet to resend).
  void Add(uint64_t flow, uint64_t bytes);
  /// The next grant, at most `quantum` bytes: its message, the new cumulative grant and the bytes added; false if
  /// no message waits.
  bool Next(uint64_t quantum, uint64_t& flow, uint64_t& cumulative, uint64_t& bytes);
  void Forget(uint64_t flow) { m_flows.erase(flow); }
  bool Waiting() const { return !m_turn.empty(); }

 private:
  struct State {
    uint64_t target = 0;
    uint64_t granted = 0;
    bool queued = false;
  };
  void Queue(uint64_t flow, State& s);

  std::unordered_map<uint64_t, State> m_flows;
  std::deque<uint64_t> m_turn;  ///< messages waiting for credit, in turn (may name forgotten ones)
};

}  // namespace ns3

#endif  // PHANTORA_UET_CREDIT_H
