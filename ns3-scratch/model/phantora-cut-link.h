// Packets over the cut links of a partitioned fabric travel as messages (issue 38, parallel packet simulation).
#ifndef PHANTORA_CUT_LINK_H
#define PHANTORA_CUT_LINK_H

#include "phantora-fabric.h"
#include "phantora-simulator-impl.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ns3 {

/**
 * The cut-link message path. Given a group per node, every cable whose ends are in different groups is cut:
 * PhantoraChannel::Transmit hands its packets to Send(), which appends a message (the arrival time step, the
 * cable and the end it arrives at, the order key PhantoraSimulatorImpl would have given the arrival event,
 * the cable's failure epoch, the link-layer credit fields and the PhantoraHeader's fields, copied from the struct in
 * native byte order, no ns-3 Buffer) to the outbox
 * instead of queuing the arrival. Deliver() queues a batch of messages at their times with their keys. In the
 * keyed mode that is the same event, in the same place of the order, as the direct path's.
 *
 * Loopback: every group runs in this engine, and the simulator's window barrier (lookahead = the least cut
 * cable delay) delivers the outboxes to this engine. A run then takes the message path and windows a worker
 * would, with results byte-identical to the keyed mode without a cut.
 *
 * Worker (`self` a group): this engine runs that group's nodes only; the outboxes (one per destination group)
 * are taken between windows by the caller and sent to the other workers, whose batches come in by Deliver().
 * A batch may also carry a flow's "sender done" (SendForget): its receiver forgets the flow on delivery; a
 * dependency's completion for a flow whose sender another worker runs (SendRelease, with the order keys one
 * engine's ScheduleStart would take; the releases one event sends a worker, one after the other, share one
 * message); a flow's completion at its receiver for its sender (SendDone); and a lower
 * bound on a flow's completion from its sender's worker for its receiver's (SendBound: the windows' release
 * bounds there).
 */
class PhantoraCutLink final : public PhantoraWindowHook {
 public:
  /// Cut the fabric's cables between groups (`groups[node]`, one per node); throws naming the field if the
  /// list does not match the fabric. A cable of an `idle` node (one that carries no packet: an NVSwitch under
  /// fluid NVLink whose GPUs span groups) is cut but not counted: its delay does not bound the windows, and a
  /// packet sent on it is an error.
  PhantoraCutLink(Ptr<PhantoraFabric> fabric, const std::vector<uint32_t>& groups, uint32_t self = kLoopback,
                  const std::vector<uint32_t>& idle = {});

  static constexpr uint32_t kLoopback = UINT32_MAX;  ///< `self` when every group runs in this engine
  ~PhantoraCutLink() override;

  /// Cables cut.
  uint32_t CutCables() const { return m_cut; }
  /// The least delay of a cut cable (ns): the windows' lookahead; 0 if none is cut.
  uint64_t LookaheadNs() const { return m_lookahead; }
  /// A packet sent on cut cable `link` arrives at its end `toEnd` (0: a, 1: b) at `arriveNs`.
  /// `epoch`: the cable's failure epoch to check on arrival, UINT64_MAX for no check.
  void Send(uint32_t link, uint32_t toEnd, const Ptr<PhantoraPacket>& pkt, uint64_t arriveNs, uint64_t epoch);
  /// Flow `flow`'s sender is done at `atNs`: tell its receiver `node` (in another group) to forget it.
  void SendForget(uint64_t flow, uint32_t node, uint64_t atNs);
  /// The messages sent to group `group` since the last call (its outbox, emptied).
  std::vector<uint8_t> TakeOutbox(uint32_t group);
  /// TakeOutbox() into `batch`, whose buffer becomes the outbox (its old bytes written over): a window loop that
  /// swaps the same buffers back and forth grows (and zero-fills) none of them again after its first windows.
  /// Returns the messages' bytes: `batch`'s first ones (its size may be larger, room kept from earlier windows).
  std::size_t SwapOutbox(uint32_t group, std::vector<uint8_t>& batch);
  /// The least arrival time of the messages sent since the last call, or UINT64_MAX; reset.
  uint64_t TakeMinArrival();
  /// Per node, the least ns from an event at it to a packet's arrival across a cut cable caused by it, inside
  /// the node's own group (UINT64_MAX: none can be): a packet reaches the next node no earlier than the cable's
  /// delay after it is sent, and an endpoint's completion may start a flow at any endpoint of its group in the
  /// same ns (a dependent's release), so the endpoints of a group share their least. The windows' earliest
  /// output (PhantoraNetwork::CutOutputBound).
  const std::vector<uint64_t>& Reach() const { return m_reach; }
  /// Reach() for this worker's own events: a node of another group counts the lookahead (nothing less).
  const std::vector<uint64_t>& OwnReach() const { return m_ownReach; }
  /// The least over the messages sent since the last call of their arrival plus Reach() at the node they
  /// arrive at (a release: its landing plus its sender's), or UINT64_MAX; reset.
  uint64_t TakeMinReach();
  /// Called on delivery of a forget message: (flow, receiver node, sender's ns).
  void SetForget(std::function<void(uint64_t, uint32_t, uint64_t)> f) { m_forget = std::move(f); }

  /// A dependency of flow `flow` (its sender `node`, in another group) completed at `atNs`, in the event whose
  /// order key is `event` (RunningKey), the `seq`-th its worker ran in that ns; `key` is the order key that event took for the flow's start (TakeKey, as one engine's
  /// ScheduleStart). `landNs`: the least ns the start can be at (the message's arrival, for the windows).
  void SendRelease(uint64_t flow, uint32_t node, uint64_t atNs, const PhantoraOrderKey& event, uint32_t seq,
                   const PhantoraOrderKey& key, uint64_t landNs);
  /// Flow `flow` (its sender `node`, in another group) is complete at its receiver: its sender's worker stops
  /// counting it in its release bounds.
  void SendDone(uint64_t flow, uint32_t node, uint64_t atNs);
  /// Called on delivery of a release message: (flow, completion ns, completion event's key (RunningKey), the
  /// events its worker ran in that ns up to it, start key).
  using ReleaseFn =
      std::function<void(uint64_t, uint64_t, const PhantoraOrderKey&, uint32_t, const PhantoraOrderKey&)>;
  void SetRelease(ReleaseFn f) { m_release = std::move(f); }
  /// Called on delivery of a done message: (flow, its completion ns).
  void SetDone(std::function<void(uint64_t, uint64_t)> f) { m_done = std::move(f); }
  /// Flow `flow` (its receiver `node`, in another group) completes at `lbNs` or later, as its sender's worker
  /// knows (not an event: its arrival does not count in TakeMinArrival).
  void SendBound(uint64_t flow, uint32_t node, uint64_t lbNs);
  /// Called on delivery of a bound message: (flow, the bound).
  void SetBound(std::function<void(uint64_t, uint64_t)> f) { m_bound = std::move(f); }
  uint32_t NumGroups() const { return static_cast<uint32_t>(m_outboxes.size()); }
  uint32_t GroupOf(uint32_t node) const { return m_groups.at(node); }
  /// Queue the arrivals of a batch of messages (TakeOutbox()'s bytes); throws on a malformed batch.
  void Deliver(const std::vector<uint8_t>& batch);
  /// Deliver() of `size` bytes at `data`.
  void Deliver(const uint8_t* data, std::size_t size);
  /// Loopback: deliver the outbox here.
  void Barrier() override;

  /// Messages to one group: `bytes`' first `len` (the rest, kept from earlier windows, is written over).
  struct Outbox {
    std::vector<uint8_t> bytes;
    std::size_t len = 0;
    /// The last release message (SendRelease), while nothing follows it: the next release of its event joins it.
    struct Releases {
      std::size_t at = SIZE_MAX;  ///< its head's offset (SIZE_MAX: none open)
      std::size_t end = 0;        ///< len right after it
      uint64_t ns = 0;
      PhantoraOrderKey event;
      uint32_t seq = 0;
      uint64_t keyTs = 0;
      uint32_t keyNode = 0;
    } releases;
  };

  /// Release messages sent so far.
  uint64_t Releases() const { return m_releases; }
  uint64_t Messages() const { return m_messages; }
  uint64_t MessageBytes() const { return m_bytes; }
  uint64_t Barriers() const { return m_barriers; }

 private:
  /// The outbox of `node`'s group (another worker's: throws at this worker's own).
  Outbox& OutboxFor(uint32_t node) {
    const uint32_t g = m_groups[node];
    if (g == m_self) [[unlikely]] {
      OwnGroup(node);
    }
    return m_outboxes[g];
  }
  [[noreturn, gnu::cold]] void OwnGroup(uint32_t node) const;
  /// A note of `kind` on flow `flow` to `node` at `ns` (the head of every message but a packet's).
  void SendNote(uint32_t kind, uint64_t flow, uint32_t node, uint64_t ns);

  Ptr<PhantoraFabric> m_fabric;
  std::vector<uint32_t> m_groups;
  uint32_t m_self;
  std::vector<Outbox> m_outboxes;  ///< by destination group
  uint64_t m_minArrival = UINT64_MAX;
  uint64_t m_minReach = UINT64_MAX;
  std::vector<uint64_t> m_reach;     ///< Reach(), per node
  std::vector<uint64_t> m_ownReach;  ///< OwnReach(), per node
  void ComputeReach(const std::vector<bool>& idleLink);
  std::function<void(uint64_t, uint32_t, uint64_t)> m_forget;
  ReleaseFn m_release;
  std::function<void(uint64_t, uint64_t)> m_done;
  std::function<void(uint64_t, uint64_t)> m_bound;
  uint32_t m_cut = 0;
  std::vector<bool> m_idleLink;  ///< per cable: cut, with an idle end (partition.Idle): no packet may cross it
  uint64_t m_lookahead = 0;
  uint64_t m_messages = 0;
  uint64_t m_releases = 0;
  uint64_t m_bytes = 0;
  uint64_t m_barriers = 0;
};

}  // namespace ns3

#endif  // PHANTORA_CUT_LINK_H
