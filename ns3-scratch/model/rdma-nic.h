// RDMA NIC of an endpoint: queue pairs (one per connection, or per flow), rate pacing, ACK/NACK, go-back-N, PFC-aware.
#ifndef PHANTORA_RDMA_NIC_H
#define PHANTORA_RDMA_NIC_H

#include "class-scheduler.h"
#include "congestion-control.h"
#include "flat-id-map.h"
#include "phantora-net-device.h"
#include "phantora-routing.h"
#include "sack-transport.h"
#include "uet-credit.h"
#include "uet-transport.h"
#include "wire-format.h"

#include "ns3/callback.h"
#include "ns3/event-id.h"
#include "ns3/node.h"
#include "ns3/nstime.h"
#include "ns3/object-factory.h"
#include "ns3/object.h"
#include "ns3/traced-callback.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

namespace ns3 {

/// A flow as the sending NIC sees it.
struct QpSpec {
  uint64_t id = 0;
  uint32_t dst = 0;
  uint64_t size = 0;
  uint8_t prio = 3;
  uint64_t key = 0;  ///< ECMP key: what the switches hash (the route is `viaNic`)
  bool viaNic = false;  ///< leave through the NIC even towards a GPU of a shared NVSwitch (phantora Flow.via_nic)
  uint64_t lossBudget = 0;  ///< DLCP: payload bytes the receiver may accept as lost (0 = lossless)
  uint64_t maxRateBps = 0;  ///< rate cap, payload bits/s (e.g. an NCCL channel's throughput limit; 0 = none)
  uint64_t conn = 0;  ///< connection: flows with the same non-zero id are messages on one queue pair; 0 = its own
  uint64_t queue = 0;  ///< flows with the same non-zero id go on the wire one at a time, in the order they start
};

/**
 * The NIC of one endpoint. Sender: a queue pair per connection (QpSpec::conn; a flow without one gets a queue
 * pair of its own) with its own CongestionControl object; the queue pairs of a port share it packet by packet,
 * round robin, each paced at its CC rate and capped by its CC window; a NACK or a timeout rewinds to the first
 * unacknowledged byte (go-back-N).
 * Connections persist, as an NCCL connection's queue pair does for the communicator's life: the flows of one
 * connection are its messages, sent in the order they started (a message sends new data only once every earlier
 * one has been sent once), sharing its pacing, its window and its CC state, which sees one byte stream (the
 * sequence numbers it is given run on across messages). When a connection's last open message finishes the CC is
 * told OnIdle; the next message calls OnResume, so a rate cut outlives a message and recovers with time as the
 * CC's own timers would have it.
 * Receiver: in-order delivery; an ACK per `ackInterval` packets carries the ECN echo and the INT
 * stack of the data packet; a gap triggers a NACK. Control packets use class 0 (strict priority).
 * An ACK or NACK that echoes a CE mark is counted by the sender (`ecnEchoes`); for a CC that uses CNPs (DCQCN:
 * CongestionControl::UsesCnp) it is a CNP too: counted (`cnps`) and fired as the "CnpRx" trace. The echo rides on
 * the ACK the receiver sends anyway, so no CC adds packets to the wire for it.
 * With Receiver = sack the receiver keeps out-of-order data instead (SackReceiver), every ACK carries the
 * received block holding the packet, and the sender retransmits only the packets its SackSender deems lost.
 * Settings are attributes (PayloadSize, AckInterval, NackInterval, RetransmitTimeout, ...).
 * DLCP: a flow with a loss budget sends its first transmissions flagged loss-tolerant; the receiver takes a
 * trimmed packet as a hole while the holes fit the budget (never retransmitted), else NACKs it with the
 * budget-spent flag, after which the sender flags nothing more (retransmissions are never flagged).
 * With Receiver = rud (Ultra Ethernet RUD, uet-transport.h) every data packet is trimmable; the receiver keeps
 * out-of-order data by PSN, each ACK carries the cumulative point, a 64-packet SACK bitmap and the packet it
 * acknowledges, and a trimmed packet's header is NACKed at once; the sender resends exactly the NACKed
 * transmission (and, after RetransmitTimeout, packets sent that long ago), never going back. The CC window
 * caps the bytes in flight that are neither acknowledged nor lost. With LoadBalancing = reps or oblivious the
 * sender gives each data packet an entropy value (REPS recycles those that came back without a CE mark).
 * With Receiver = rod (UET reliable ordered delivery) every data packet is trimmable too, but a queue pair keeps
 * one entropy value (one path, so the fabric keeps its order); the receiver takes packets in order only, NACKs a
 * trimmed packet it expected at once and an out-of-order one as go-back-N does, and the sender goes back to
 * the NACKed packet (once per transmission NACKed for a trim: the NACK echoes its send time).
 * Receiver credits (UET RCCC, when the queue pair's CC says UsesReceiverCredit: `--cc rccc`, or NSCC with
 * ReceiverCredit): a message sends only against credit (CreditLedger), each data packet asks for a cumulative
 * grant, and each receiving port grants CreditQuantum packets at a time to the messages that asked, in turn,
 * paced at CreditRate x its line rate (CreditPacer), on Credit packets in class 0. A trimmed packet's NACK adds
 * its bytes to the grant; after a retransmission timeout the sender may resend what it marked lost without one.
 * Sleek (Receiver = rud): SLEEK loss recovery for losses no NACK reports (RudSender::Sleek), its threshold
 * max(min(SleekFactor x window, 1.5 BDP), SleekMinPackets) packets acknowledged beyond the cumulative point;
 * and, for a tail loss, when no ACK came for 3 base RTTs (1.75 once everything was sent once) with data in
 * flight, the packets sent a base RTT ago or more are taken as lost (htsim sends a probe packet there first).
 * Rate cap: a queue pair with QpSpec::maxRateBps is paced at min(CC rate, line rate, cap); the cap counts
 * payload bits and is charged for the packet being sent, as a fluid flow at the cap would carry it: a packet's
 * last bit leaves (at line rate) no earlier than its payload at the cap after the previous packet's end on its
 * queue pair, or, for a message's first packet, after the message's start (its queue's previous message's end,
 * if later). So packet k of a message started at t ends no earlier than t + (k + 1) x payload x 8 / cap, the
 * short last packet at t + size x 8 / cap; where the cap does not bind (payload / cap <= wire / line) nothing
 * is held.
 */
class RdmaNic : public Object, public PortOwner {
 public:
  static TypeId GetTypeId();

  /// Signature of the "Nack" and "Timeout" trace sources.
  typedef void (*FlowSeqTracedCallback)(uint64_t flowId, uint64_t seq);
  /// Signature of the "CnpRx" trace source: the flow, the node that sent the CNP, the acknowledged seq.
  typedef void (*CnpTracedCallback)(uint64_t flowId, uint32_t fromNode, uint64_t seq);
  /// Signature of the "Failover" trace source: the flow, the port it left and the port it moved to (UINT32_MAX:
  /// no route left, it stalls; a stalled queue pair that finds a route again leaves UINT32_MAX).
  typedef void (*FailoverTracedCallback)(uint64_t flowId, uint32_t fromPort, uint32_t toPort);
  /// Signature of the "Retransmit" trace source: the flow, the packet's payload bytes, and whether every byte of
  /// the flow had been sent once before it (only then can its receiver already have them all).
  typedef void (*RetransmitTracedCallback)(uint64_t flowId, uint32_t payload, bool allSentOnce);

  /// Told the id of a flow (the receiver has every byte / the sender has every byte acknowledged).
  typedef Callback<void, uint64_t> FlowCallback;
  /// Asked (source, destination, ECMP key) for the base RTT (ns) or BDP (bytes) given to a flow's CC.
  typedef Callback<uint64_t, uint32_t, uint32_t, uint64_t, bool> PathQuery;  ///< (src, dst, key, viaNic)

  /// Counters of this NIC (summed over the fabric by PhantoraNetwork::Stats).
  struct Counters {
    uint64_t dataPackets = 0;  // (the four per-packet counts first: one cache line)
    uint64_t acks = 0;
    uint64_t payloadBytesDelivered = 0;
    uint64_t ecnEchoes = 0;  ///< ACKs and NACKs received with ECN echo, whatever the CC
    uint64_t retxPackets = 0;
    uint64_t retxBytes = 0;
    uint64_t oooPackets = 0;       ///< data packets received with a hole before them
    uint64_t reorderMaxBytes = 0;  ///< max over flows of FlowTransportStats::reorderMaxBytes
    uint64_t nacks = 0;
    uint64_t timeouts = 0;
    uint64_t cnps = 0;  ///< CNPs received: ACKs and NACKs with ECN echo, for a CC that uses CNPs (UsesCnp)
    uint64_t trimNacks = 0;  ///< Receiver rud: NACKs of trimmed packets received by senders
    uint64_t entropiesExplored = 0;  ///< LoadBalancing reps / oblivious: fresh entropy values drawn
    uint64_t entropiesRecycled = 0;  ///< LoadBalancing reps: entropy values reused after a good ACK
    uint64_t repsFreezes = 0;  ///< LoadBalancing reps: connections frozen by a retransmission timeout
    uint64_t queuePairs = 0;  ///< queue pairs opened: one per connection, plus one per flow without a connection
    uint64_t failovers = 0;   ///< queue pairs moved to another port at a re-convergence (PortFailover)
  };

  /// Own the PhantoraNetDevices of `node` (port i = device i), as fabric node `nodeId`.
  void Install(Ptr<Node> node, uint32_t nodeId, Ptr<RouteTable> routes);
  /// Each queue pair gets a CC object made by this factory (a CongestionControl subclass).
  void SetCongestionControlFactory(const ObjectFactory& factory) { m_ccFactory = factory; }
  void SetFlowCallbacks(FlowCallback dataComplete, FlowCallback senderDone);
  void SetCcPathQueries(PathQuery baseRttNs, PathQuery bdpBytes);

  /// Open a queue pair and start sending now; with no route to its destination (a scenario's failure) it opens
  /// stalled and waits for Repin to find one.
  void StartFlow(const QpSpec& spec);
  /// Routing re-converged (a scenario, docs/scenarios.md): with PortFailover each open queue pair moves to the port
  /// routing now picks for it (a live port of this endpoint where it has another), one with no route left stalls
  /// (sends nothing) and a stalled one with a route again resumes; the transport recovers what was lost on the
  /// dead port (NACK, timeout). ACKs pick their port afresh. Returns the ids of the queue pairs stalled now.
  std::vector<uint64_t> Repin();
  /// Whether the open queue pair of this flow is stalled with no route (false if none is open).
  bool Stalled(uint64_t flowId) const;
  /// Get ready to receive `size` bytes of flow `id`.
  void ExpectFlow(uint64_t id, uint64_t size, uint64_t lossBudget = 0);
  /// The byte ranges (offset, length) of flow `id` the receiver took as lost, merged; forgets them.
  std::vector<std::pair<uint64_t, uint64_t>> TakeLost(uint64_t id);
  void ForgetFlow(uint64_t id);

  bool Dequeue(uint32_t port, const bool* paused, TxItem& out) override;
  void Receive(uint32_t port, const Ptr<PhantoraPacket>& pkt) override;

  /// Flows being sent (messages on their queue pairs).
  uint32_t ActiveQps() const { return static_cast<uint32_t>(m_qps.size()); }
  const Counters& GetCounters() const { return m_counters; }
  uint32_t GetPayloadSize() const { return m_payloadBytes; }
  const WireFormat& GetWireFormat() const { return m_wire; }
  /// The CC object of an open queue pair (nullptr once finished).
  Ptr<CongestionControl> GetCc(uint64_t flowId) const;
  /// Reordering seen by this receiver for a flow it expects (zeros if unknown).
  FlowTransportStats RxStats(uint64_t flowId) const;
  /// Retransmissions of an open queue pair, or of one that finished and was not taken yet (zeros if unknown);
  /// `take` forgets a finished one.
  FlowTransportStats TxStats(uint64_t flowId, bool take = false);
  /// An open queue pair's progress: the bytes it has sent at least once (its highest byte sent) and its port's
  /// line rate; false if the flow has no open queue pair here.
  bool SendProgress(uint64_t flowId, uint64_t& sentOnce, uint64_t& lineBps) const;
  /// Port `port`'s line rate (bits/s).
  uint64_t PortRateBps(uint32_t port) const { return m_dev.at(port)->GetRateBps(); }
  /// The ns an open queue pair first sent its flow's last byte (the packet that carries it left no earlier), or
  /// -1 if not yet or if the flow has no open queue pair here.
  int64_t LastByteSentNs(uint64_t flowId) const;
  /// Mark every data packet that carries its flow's last byte (kFlagLastByte), for the switches' completion bounds.
  void MarkLastByte(bool on) { m_markLastByte = on; }

 protected:
  void DoDispose() override;

 private:
  struct Qp;
  /// A queue pair: what the messages (flows) of one connection share.
  struct Conn {
    Ptr<CongestionControl> cc;
    uint64_t streamBytes = 0;   ///< bytes of the messages started on it so far (the CC's sequence space)
    uint64_t nextAvailPs = 0;   ///< pacing: earliest time of the next packet
    uint64_t paceRem = 0;       ///< sub-ps remainder of the pacing intervals
    uint64_t lastStartPs = 0;   ///< the last data packet's ideal start (ps) and wire bytes: where the rate cap
    uint32_t lastWire = 0;      ///< of the next packet counts from (its end at line rate; CapDuePs)
    uint64_t capEndPs = 0;      ///< rate cap: where the last capped packet's payload ended on the cap's schedule
    uint32_t dst = 0;
    std::vector<Qp*> open;      ///< its messages not finished, in the order they started
    uint32_t timed = 0;         ///< how many of them wait for their time off their port's ready list (Port::timed)
    RepsFreeze reps;            ///< LoadBalancing reps: freezing after a timeout, across its messages
  };
  /// A flow being sent: one message on a queue pair.
  struct Qp {
    QpSpec spec;
    uint32_t port = 0;
    Conn* conn = nullptr;         ///< its queue pair (`own`, or a connection's in m_conns)
    std::unique_ptr<Conn> own;    ///< the queue pair of a flow without a connection
    bool stalled = false;         ///< no route to its destination: off every port's list until Repin finds one
    bool ready = false;           ///< on its port's `ready` list (not parked: see Port::ready)
    bool timed = false;           ///< on its port's `timed` list instead: waiting for its time (Port::timed)
    uint64_t timedAt = 0;         ///< timed: the ps it waits for (as Dequeue's wake-up counts it), a lower bound
    uint64_t timedSndNxt = 0;     ///< timed: its sndNxt then (a rewind changes its next packet, so its time)
    uint64_t listSeq = 0;         ///< when it joined its port's list (Enlist): the lists' order
    bool creditOn = false;        ///< its CC runs under receiver credits (read per Dequeue: beside sndNxt)
    uint64_t base = 0;            ///< where this message starts in its queue pair's byte stream
    uint64_t sndNxt = 0;
    uint64_t sndUna = 0;
    uint64_t maxSent = 0;       ///< highest byte sent so far (to count retransmissions)
    int64_t lastByteNs = -1;    ///< the ns the last byte was first sent (completion bounds), -1 before
    uint64_t capFloorPs = 0;    ///< rate cap: its first packet's payload counts from here (its start, or its
                                ///< queue's previous message's last packet's end)
    /// CapDuePs's last answer and what it was computed from (its connection's last packet start and wire bytes
    /// and cap schedule end, the floor, the payload and the line rate): a capped queue pair waiting for its time is
    /// asked per Dequeue.
    mutable uint64_t capMemoDue = 0;
    mutable uint64_t capMemoSchedEnd = 0;  ///< CapEndPs of the same inputs (BuildData moves the schedule to it)
    mutable uint64_t capMemoStart = 0;
    mutable uint64_t capMemoEnd = 0;
    mutable uint64_t capMemoFloor = 0;
    mutable uint64_t capMemoLine = 0;
    mutable uint32_t capMemoWire = 0;
    mutable uint32_t capMemoPayload = 0;  ///< 0: no answer kept
    uint64_t lastProgressNs = 0;
    uint64_t lastRewindSeq = UINT64_MAX;
    uint64_t lastRewindNs = 0;
    uint64_t rttNs = 0;
    EventId rto;
    bool budgetGone = false;    ///< DLCP: the receiver spent the loss budget; flag nothing more
    SackSender sack;            ///< Receiver = sack: the packets in flight
    RudSender rud;              ///< Receiver = rud: the packets in flight
    EntropyPicker ev;           ///< LoadBalancing reps / oblivious: entropy per data packet
    uint16_t pathEntropy = 0;   ///< Receiver rod: the queue pair's one entropy value
    uint64_t bdpBytes = 0;      ///< its path's BDP (as given to CCs): SLEEK's largest window
    EventId probe;              ///< Sleek: the tail-loss probe
    uint64_t probeAtNs = 0;     ///< Sleek: when it is due (each ACK moves it on)
    CreditLedger credit;        ///< creditOn: what it may send
    FlowTransportStats stats;   ///< retransmissions
  };
  struct Rx {
    uint64_t size = 0;
    uint64_t expected = 0;
    uint32_t sinceAck = 0;
    PhantoraHeader unacked;  // the last in-order data packet not yet acknowledged (sinceAck > 0)
    EventId ackTimer;        // AckDelay after the first packet an ACK was held back for
    uint64_t lastNackSeq = UINT64_MAX;
    uint64_t lastNackNs = 0;
    bool done = false;
    uint64_t budget = 0;  ///< DLCP loss budget, bytes
    uint64_t lost = 0;    ///< bytes taken as lost so far
    std::vector<std::pair<uint64_t, uint64_t>> holes;  ///< (offset, length), merged
    SackReceiver sack;          ///< Receiver = sack: received ranges
    RudReceiver rud;            ///< Receiver = rud: received PSNs
    uint32_t creditPort = UINT32_MAX;  ///< receiver credits: the port whose pacer grants this flow's credit
    uint32_t creditPeer = 0;           ///< receiver credits: the sender, and the ECMP key and route of its grants
    uint64_t creditKey = 0;
    bool creditViaNic = false;
    FlowTransportStats stats;   ///< reordering
    /// The port of the last ACK and the destination, ECMP key and route it was picked for (RouteTable::Pick is a
    /// pure function of them here, and a flow's ACKs mostly keep theirs): saves a hash lookup per ACK.
    mutable uint64_t ackKey = 0;
    mutable bool ackViaNic = false;
    mutable uint32_t ackDst = 0;
    mutable uint32_t ackPort = UINT32_MAX;
  };
  /// A port's queue pairs. `active` holds every one listed (round robin order: by listSeq), `ready` those of them
  /// not parked, in the same order. Dequeue parks a queue pair that has nothing to send whatever the time (every
  /// byte sent and nothing lost, or not its turn: InTurn) and looks at `ready` only; Recheck puts it back as soon
  /// as that may no longer hold (a rewind, a loss, an earlier message sent or finished), so the pick and the
  /// wake-up are those of a scan of `active`, at the cost of the queue pairs that may send.
  /// A queue pair held back by its pacing or rate cap waits on `timed` instead, ordered by the ps it waits for
  /// (Qp::timedAt): what it counts towards the port's wake-up, a lower bound of its time while nothing it depends on
  /// moves back (its sndNxt or a loss, Recheck; its connection's last packet, BuildData; the port's rate). It goes
  /// back to `ready` in the ns that time comes; a wake-up with nothing sent looks at the timed ones in order only
  /// until one still waits for the time it is kept under (Dequeue: TimedEarliest).
  struct Port {
    RingQueue<TxItem> ctrl;
    std::vector<Qp*> active;
    std::vector<Qp*> ready;
    std::vector<Qp*> timed;   ///< by Qp::timedAt
    uint64_t timedLine = 0;   ///< the port's rate when the timed ones were last timed (their times depend on it)
    uint64_t rrSeq = 0;  ///< the round robin goes on at the first of `active` listed at or after this (Qp::listSeq)
    EventId wake;
    uint64_t wakeNs = 0;
    bool wakeArmed = false;  ///< `wake` is pending (cleared when it runs: cheaper than EventId::IsPending)
    CreditPacer credit;       ///< receiver credits: grants for the flows arriving here
    EventId creditEv;         ///< the next grant
    uint64_t creditAtPs = 0;  ///< when the pacer may grant again
    uint64_t creditRem = 0;   ///< sub-ps remainder of its intervals
  };

  /// The queue pair of a new flow: its own, or its connection's (opened on first use, resumed if idle).
  Conn* OpenConn(Qp* qp, uint64_t nowNs);
  /// A message may send new data once every earlier message of its queue pair, and of its queue (QpSpec::queue),
  /// has been sent once.
  bool InTurn(const Qp* qp) const;
  /// What Dequeue does with a listed queue pair at `nowPs`: park it (nothing to send whatever the time), skip it
  /// (PFC pause, no credit, a full window: nothing towards the wake-up), let it wait until `atPs` (pacing or rate
  /// cap: the wake-up's ps) or send from it now.
  enum class Look { Park, Skip, Wait, Send };
  Look LookAt(Qp* qp, const bool* paused, uint64_t nowPs, uint64_t& atPs) const;
  /// Put qp, marked timed with its Qp::timedAt set, on its port's `timed` list.
  void Hold(Qp* qp);
  /// Take a timed qp off its port's `timed` list (neither ready nor timed after).
  void Unhold(Qp* qp);
  /// Put a parked qp (neither ready nor timed) back on its port's `ready` list, in order.
  void Ready(Qp* qp);
  /// The earliest ps below `bound` that a timed queue pair of port `p` counts towards the port's wake-up, as a scan
  /// of them would find it, else `bound`: looks at them in order until one waits for the time it is kept under,
  /// parking those with nothing to send and moving on those whose time has.
  uint64_t TimedEarliest(Port& p, const bool* paused, uint64_t nowPs, uint64_t bound);
  /// Bytes in flight on qp's queue pair, over all its messages (what its CC window caps).
  uint64_t InFlight(const Qp* qp) const;
  void BuildData(Qp* qp, TxItem& out, uint64_t nowNs);
  /// Rate cap: the earliest ideal start (ps) of qp's next data packet of `payload` bytes, so that its last bit
  /// leaves at line rate no earlier than CapEndPs; 0 without a cap.
  uint64_t CapDuePs(const Qp* qp, uint32_t payload) const;
  /// Rate cap: where qp's next packet of `payload` bytes ends on the cap's schedule: its payload at the cap after
  /// the previous capped packet's schedule end, the floor, or the previous packet's end at line rate less that
  /// payload's time at the cap, whichever is latest (a packet held back by others on the port, an ACK say, is made
  /// up by the next ones; a lag longer than one packet's time at the cap is not); 0 without a cap.
  uint64_t CapEndPs(const Qp* qp, uint32_t payload) const;
  /// The ps `wire` bytes take at the line rate of qp's port (no remainder carried).
  uint64_t LinePs(const Qp* qp, uint32_t wire) const;
  void ReceiveData(uint32_t port, const PhantoraHeader& hdr);
  /// Receiver credits: a data packet asked for credit (arrived on `port`).
  void CreditAsk(Rx& rx, const PhantoraHeader& hdr, uint32_t port);
  /// Receiver credits: a trimmed packet of `rx` needs `bytes` more credit to be resent.
  void CreditAdd(Rx& rx, uint64_t flowId, uint64_t bytes);
  /// Receiver credits: the port's pacer sends its next grant, if any, and schedules the one after.
  void CreditTurn(uint32_t port);
  /// Receiver credits: a grant reached this sender.
  void ReceiveCredit(const PhantoraHeader& hdr);
  /// Receiver = sack: keep the packet whatever its order, ACK out-of-order arrivals at once with their block.
  void ReceiveDataSack(Rx& rx, const PhantoraHeader& hdr);
  /// Receiver = rud: keep the packet whatever its order; NACK a trimmed one; ACK with the SACK bitmap.
  void ReceiveDataRud(Rx& rx, const PhantoraHeader& hdr);
  void ReceiveAck(const PhantoraHeader& hdr);
  void ReceiveAckRud(Qp* qp, const PhantoraHeader& hdr);
  /// An ACK or NACK of `qp` echoed a CE mark: counted as an ECN echo, and as a CNP if its CC uses CNPs.
  void EcnEchoed(Qp* qp, const PhantoraHeader& hdr);
  void SendAck(const PhantoraHeader& data, PktType type, const Rx& rx, uint8_t extraFlags = 0, uint64_t sackLo = 0,
               uint64_t sackHi = 0, bool dsack = false, uint64_t bitmap = 0);
  /// AckDelay ran out with coalesced packets unacknowledged: acknowledge them now.
  void AckTimeout(uint64_t flowId);
  void Finish(Qp* qp);
  /// Take qp off its port's round robin (it is on it unless stalled).
  void Unlist(Qp* qp);
  /// Put qp on `port`'s round robin and kick the port.
  void Enlist(Qp* qp, uint32_t port);
  /// Put a parked qp back on its port's `ready` list if it may send (it has something lost to resend, or unsent
  /// data and its turn); nothing for one that is on it or stalled.
  void Recheck(Qp* qp);
  /// Recheck the messages after position `from` of `order` (a connection's or a queue's messages, in order) up to
  /// the first with data not yet sent: those whose turn an earlier message's progress or end may have given.
  void RecheckFrom(const std::vector<Qp*>& order, size_t from);
  /// Recheck the messages after qp on its connection and on its queue.
  void RecheckAfter(const Qp* qp);
  void ArmRto(Qp* qp);
  /// Sleek: no ACK for a probe time with data in flight: the packets sent a base RTT ago or more are lost.
  void SleekProbe(Qp* qp);
  void CheckRto(Qp* qp);
  void Wake(uint32_t port, uint64_t atNs);
  void OnWake(uint32_t port);
  uint64_t GetHeaderSize() const;
  void SetHeaderSize(uint64_t bytes);
  uint64_t GetIntHeaderSize() const;
  void SetIntHeaderSize(uint64_t bytes);
  bool GetIntEnabled() const;
  void SetIntEnabled(bool on);

  // Read for every packet (Dequeue, BuildData, Receive, SendAck, ReceiveAck): together at the start of the object,
  // a few cache lines, as a NIC is cold when its next packet comes (a thousand NICs in a large fabric).
  uint32_t m_id = 0;
  uint32_t m_payloadBytes = 1000;  // (attribute)
  WireFormat m_wire;               // (attributes)
  uint32_t m_ackInterval = 1;      // (attribute)
  RxMode m_rxMode = RxMode::GoBackN;
  EntropyMode m_entropyMode = EntropyMode::None;
  bool m_ackHighPrio = true;
  bool m_markLastByte = false;  ///< MarkLastByte
  bool m_strict = false;
  bool m_sleek = false;
  std::vector<Ptr<PhantoraNetDevice>> m_dev;
  std::vector<Port> m_ports;
  FlatIdMap<Qp> m_qps;  ///< the flows being sent, by id (looked up per ACK)
  FlatIdMap<Rx> m_rx;   ///< the flows being received, by id (looked up per data packet)
  Ptr<RouteTable> m_routes;
  Counters m_counters;
  uint64_t m_listSeq = 0;  ///< the last Qp::listSeq given
  // Attributes.
  Time m_ackDelay;
  std::string m_classSchedText = "rr";
  Time m_nackInterval;
  Time m_rto;
  std::string m_rxModeName = "gbn";
  Time m_reorderWindow;
  std::string m_lbModeName = "ecmp";
  uint32_t m_entropies = 256;
  uint32_t m_repsBuffer = 8;
  Time m_repsFreeze;
  uint32_t m_repsThawExplore = 16;
  double m_creditRate = 0.99;
  double m_sleekFactor = 1.5;
  uint32_t m_sleekMinPackets = 5;
  uint32_t m_creditQuantum = 4;
  bool m_portFailover = true;
  Ptr<UniformRandomVariable> m_evRng;
  // Wiring.
  FlowCallback m_dataComplete;
  FlowCallback m_senderDone;
  PathQuery m_baseRtt;
  PathQuery m_bdp;
  ObjectFactory m_ccFactory;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> m_conns;  ///< connections by QpSpec::conn
  std::unordered_map<uint64_t, std::vector<Qp*>> m_queues;  ///< QpSpec::queue -> its flows not finished, in order
  std::unordered_map<uint64_t, FlowTransportStats> m_doneTx;  ///< finished queue pairs' retransmissions

  TracedCallback<uint64_t, uint64_t> m_nackTrace;     ///< (flow, seq) NACK sent by this receiver
  TracedCallback<uint64_t, uint64_t> m_timeoutTrace;  ///< (flow, seq) go-back-N timeout at this sender
  TracedCallback<uint64_t, uint32_t, uint64_t> m_cnpTrace;  ///< (flow, from node, ack seq) CNP reached this sender
  TracedCallback<uint64_t, uint32_t, uint32_t> m_failoverTrace;  ///< (flow, from port, to port) at a Repin
  TracedCallback<uint64_t, uint32_t, bool> m_retxTrace;  ///< (flow, payload, all sent once) a data packet sent again
};

}  // namespace ns3

#endif  // PHANTORA_RDMA_NIC_H
