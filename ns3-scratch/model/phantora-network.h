// PhantoraNetwork: the one class Python (and the standalone runner) talks to.
//
// Build a fabric (AddNode, AddLink, SetParam, Finalize), add flows with dependencies, run in
// windows of simulated time, and drain results. Times are integer ns. Only standard types cross
// this interface, so it loads into cppyy without the model headers. One live instance per
// process (ns-3 has one global simulator); Close() (or the destructor) resets the simulator.
//
// The interface's version is kPhantoraInterfaceVersion in phantora-interface-version.h (and
// INTERFACE_VERSION in phantora/netsim/ns3_abi.py): bump both with every change here a caller must
// follow (an argument, a word of AddFlows' rows, a record's layout).
#ifndef PHANTORA_NETWORK_H
#define PHANTORA_NETWORK_H

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ns3 {

class PhantoraCutLink;

/// A flow whose last byte reached its destination.
struct FlowRecord {
  uint64_t id;
  uint32_t src;
  uint32_t dst;
  uint64_t size;
  int64_t startNs;  ///< dependencies released (+ delay): the queue pair opened
  int64_t endNs;    ///< last byte received
};

/// A flow whose sender got its last ACK: the fields of HPCC's fct.txt.
struct FctRecord {
  uint64_t id;
  uint32_t src;
  uint32_t dst;
  uint32_t sport;
  uint32_t dport;
  uint64_t size;
  int64_t startNs;
  int64_t fctNs;         ///< last ACK at the sender - start
  int64_t standaloneNs;  ///< base RTT + size with headers at the path's line rate, or payload at the flow's cap
};

/// A PFC frame received by a port (the paused side), as in HPCC's pfc.txt.
struct PfcRecord {
  int64_t timeNs;
  uint32_t node;      ///< the node whose port is paused / resumed
  uint32_t nodeType;  ///< 0 endpoint, 1 switch, 2 NVSwitch
  uint32_t port;      ///< 0-based port of that node
  uint32_t prio;
  uint32_t pause;     ///< 1 pause, 0 resume
  uint32_t fromNode;  ///< the switch that sent it
};

/// Bytes queued at a switch egress (port, class) at a sampling instant.
struct QueueSample {
  int64_t timeNs;
  uint32_t node;
  uint32_t port;
  uint32_t prio;
  uint64_t bytes;
};

/// A packet dropped at a switch ingress.
struct DropRecord {
  int64_t timeNs;
  uint32_t node;
  uint32_t port;
  uint32_t prio;
  uint64_t flowId;
  uint64_t seq;
};

/// A loss-tolerant data packet trimmed to its header at a switch egress (DLCP).
struct TrimRecord {
  int64_t timeNs;
  uint32_t node;     ///< the switch
  uint32_t port;     ///< its egress port (0-based)
  uint32_t prio;
  uint64_t flowId;
  uint64_t seq;
  uint32_t payload;  ///< payload bytes cut off
};

/// Bytes of a loss-tolerant flow its receiver took as lost (DLCP), one merged range.
struct LossRecord {
  uint64_t flowId;
  uint64_t offset;
  uint64_t bytes;
};

/// A CNP (an ACK or NACK echoing a CE mark) received by a sending NIC (DCQCN's reaction point).
struct CnpRecord {
  int64_t timeNs;
  uint32_t node;      ///< the sender that received it
  uint32_t fromNode;  ///< the receiver that sent it
  uint64_t flowId;
  uint64_t seq;       ///< the acknowledged sequence it carried
};

/// A data packet CE-marked at a switch egress.
struct EcnRecord {
  int64_t timeNs;
  uint32_t node;     ///< the switch
  uint32_t port;     ///< its egress port (0-based)
  uint32_t prio;
  uint32_t channel;  ///< the directed channel that port sends on (as ChannelRecord.channel)
  uint64_t flowId;
};

/// The order key of the event that made a record (a partition worker's records, PhantoraOrderKey): one engine
/// runs the events of one ns in (schedTs, node, count) order, so records of one ns from several workers merge
/// in that order (bridge.cut_pool); the records of one event keep the order they were made in.
struct RecordKey {
  int64_t ns;        ///< the event's time
  uint64_t schedTs;  ///< when it was scheduled
  uint32_t node;     ///< by which node (PhantoraOrderKey::kCaller, kNoContext)
  uint32_t count;    ///< that node's count of events scheduled before it
};

/// Traffic of one directed channel (2*link = a->b, 2*link+1 = b->a).
struct ChannelRecord {
  uint32_t channel;
  uint32_t src;
  uint32_t dst;
  uint64_t bps;
  uint64_t txBytes;
  uint64_t txPackets;
  uint64_t pausedNs;       ///< class-ns the sending port spent paused by PFC
  uint64_t ecnMarks;       ///< CE marks made at the sending port (switches)
  uint64_t maxQueueBytes;  ///< peak bytes queued at the sending port (switches)
};

/// A flow's transport counters: retransmissions at its sender, reordering at its receiver.
struct FlowTransportRecord {
  uint64_t id;
  uint64_t retxPackets;
  uint64_t retxBytes;
  uint64_t oooPackets;       ///< data packets that arrived with a hole before them
  uint64_t reorderMaxBytes;  ///< the furthest a packet arrived ahead of the first missing byte
};

/// The earliest a started flow can still complete at its receiver (CompletionBounds).
struct FlowBound {
  uint64_t id;
  int64_t ns;
};

class PhantoraNetwork {
 public:
  PhantoraNetwork();
  ~PhantoraNetwork();
  PhantoraNetwork(const PhantoraNetwork&) = delete;
  PhantoraNetwork& operator=(const PhantoraNetwork&) = delete;

  /// Set an attribute before Finalize: "nic.ATTR", "switch.ATTR", "cc.ATTR" (of the CC type), "fabric.ATTR" or
  /// "recorder.ATTR" (see docs/packet-model.md); the text is checked first. Throws std::invalid_argument.
  void SetParam(const std::string& key, const std::string& value);
  /// "host", "gpu", "switch" or "nvswitch"; returns the node id (dense, from 0).
  uint32_t AddNode(const std::string& kind);
  /// A full-duplex link; returns its id. Ports are numbered per node in link order.
  uint32_t AddLink(uint32_t a, uint32_t b, uint64_t bps, uint64_t delayNs);
  void Finalize();

  /// A flow that starts at max(startNs, last dep completion) + delayNs. `ecmpKey` is what the switches hash;
  /// `viaNic` its route: through its endpoints' NICs even between GPUs of one NVSwitch (NCCL's NET transport
  /// there, phantora Flow.via_nic), else over the NVSwitch they share.
  void AddFlow(uint64_t id, uint32_t src, uint32_t dst, uint64_t sizeBytes, int64_t startNs, uint32_t priority,
               uint64_t ecmpKey, const std::vector<uint64_t>& deps, int64_t delayNs, uint32_t dport = 100,
               bool viaNic = false);
  /// The 8-byte ids packed in `packed` (native byte order) as a vector: a long deps list crosses from Python in one
  /// call instead of one push_back an id. Throws std::invalid_argument if its size is not a multiple of 8.
  static std::vector<uint64_t> UnpackIds(const std::string& packed);
  /// AddFlow for each flow of `packed`, in its order: 8-byte words in native byte order, 9 per flow (id, src, dst,
  /// sizeBytes, startNs, priority, ecmpKey, delayNs, viaNic 0/1), no deps, dport 100. A batch crosses from Python
  /// in one call instead of one a flow (issue 38, a decomposition worker's insertions). Throws as AddFlow at the
  /// first bad flow (those before it are added), or std::invalid_argument if the size is not a multiple of 72
  /// bytes.
  void AddFlows(const std::string& packed);

  /// DLCP: flow `id` (added, not yet started) may lose up to `bytes` of payload to trimming; 0 = lossless.
  void SetLossBudget(uint64_t id, uint64_t bytes);

  /// Cap flow `id` (added, not yet started) at `bps` bits/s of payload, as an NCCL channel's throughput limit:
  /// its NIC paces it at min(CC rate, line rate, cap). 0 = no cap. Throws std::invalid_argument if the flow is
  /// unknown or started.
  void SetMaxRate(uint64_t id, uint64_t bps);

  /// Send flow `id` (added, not yet started) as a message on connection `conn`: the flows of one connection
  /// share a queue pair at their source NIC, in the order they start, with one CC state that persists between
  /// them (an NCCL connection's queue pair). 0 = a queue pair of its own. Throws std::invalid_argument if the
  /// flow is unknown or started; its start throws if the connection goes to another destination.
  void SetConnection(uint64_t id, uint64_t conn);

  /// Put flow `id` (added, not yet started) on queue `queue` of its source NIC: the flows of one queue go on the
  /// wire one at a time, in the order they start, each once the one before has sent its last byte (an NCCL
  /// kernel's steps to several peers in turn). 0 = none. Throws std::invalid_argument if the flow is unknown or
  /// started.
  void SetQueue(uint64_t id, uint64_t queue);

  // Scenario events (docs/scenarios.md), each at an absolute time >= Now(), after Finalize. Same-time events run
  // in the order they were scheduled. Throw std::invalid_argument for an unknown link or a time in the past.

  /// Link `link` fails (up = false) or is repaired at `atNs`. A link failed by several events comes back with
  /// its last repair. Packets sent on a failed link, or on its wire when it fails, are lost; its two ports'
  /// PFC state is cleared. Routes do not change until ScheduleReconverge.
  void ScheduleLinkState(int64_t atNs, uint32_t link, bool up);
  /// Link `link` degrades at `atNs`: both directions run at `bps` (0: the link's own rate), with
  /// `extraDelayNs` more propagation and a random loss rate `loss` in [0, 1) of non-PFC packets, drawn from a
  /// stream seeded by `seed`. (0, 0, 0) restores the link.
  void ScheduleLinkDegrade(int64_t atNs, uint32_t link, uint64_t bps, uint64_t extraDelayNs, double loss,
                           uint64_t seed);
  /// Routing re-converges at `atNs`: from then on routes avoid exactly the links failed at that instant. A
  /// started flow whose route changes then moves with the bytes it has not sent once, its queue pair to the port
  /// its NIC now routes by (failover to a live port of the endpoint); a flow left with no route stalls at its NIC
  /// until a later re-convergence finds one: counted in Stats ("rerouted_flows", "rerouted_bytes",
  /// "no_route_flows"), RerouteLog and StallLog.
  void ScheduleReconverge(int64_t atNs);
  /// Every re-convergence so far, flat: ns, flows moved, bytes moved, ns, ...
  std::vector<int64_t> RerouteLog() const;
  /// Flows stalled by the scenario so far, flat triples (ns, link, flows): a link going down, the started flows
  /// whose route (the route table's) crossed it and no earlier failure since the last re-convergence had hit
  /// (they blackhole until routing re-converges); link -1, a re-convergence, the flows it left with no route
  /// (stalled at their NIC until a later one finds a route). Stats: "stalls" (flows stopped, also those that
  /// start onto a failed link's route or with no route), "no_route_flows" (distinct flows ever left with no
  /// route), "nic_failovers" (queue pairs moved to another port of their NIC, RdmaNic::Repin).
  std::vector<int64_t> StallLog() const;
  /// A slow GPU (scenario gpu_slow) on endpoint `node`: compute runs `factor` times slower in [startNs, endNs)
  /// (endNs < 0: to the end). A flow of no bytes from a node to itself with a delay (a replay's compute marker)
  /// has its delay stretched: done at speed 1/factor inside each window, full speed outside; windows multiply.
  void SetThrottle(uint32_t node, int64_t startNs, int64_t endNs, double factor);
  /// A slow GPU that opens when flow `id` (a replay's step marker; added or to be added, not yet complete)
  /// completes at its receiver: SetThrottle(node, end, end + durationNs, factor) at that ns (durationNs < 0: to the
  /// end), before its dependents are released, so a compute marker it releases is stretched from its start (a
  /// scenario's gpu_slow at a step, which opens when the rank starts that step).
  void ThrottleFromFlow(uint64_t id, uint32_t node, int64_t durationNs, double factor);
  /// Flow `id` (to be added) keeps its delay under a throttle (a marker at an absolute time, not compute).
  void ExemptFromThrottle(uint64_t id);

  // Each run call below stops within one event of SIGTERM or SIGINT (see phantora-interrupt.h): it then
  // returns at once (false) and InterruptedBy() names the signal; the network is part-way and every later run
  // call throws. Python's own handler of the signal runs as the call returns.

  /// Process every event at or before `ns`; Now() becomes `ns`.
  void RunUntil(int64_t ns);
  /// RunUntil(ns), but return right after the first ns at which a flow in `watch` completes at its
  /// receiver: every event of that ns is run and Now() is that ns (exact co-simulation stops there); but
  /// not past a completion that leaves no flow in flight: then it returns right after that event, where
  /// RunUntilIdle stops. ns < 0: no limit; then also return at the ns at which no flow is in flight any
  /// more (or when nothing is scheduled). True if a watched flow completed.
  bool RunUntilWatched(int64_t ns, const std::vector<uint64_t>& watch);
  /// RunUntilWatched(ns, every flow): return right after the first ns at which any flow completes at its
  /// receiver (a caller that keeps its own dependencies, e.g. beside a second engine, steps this way).
  bool RunUntilCompletion(int64_t ns);
  /// RunUntilCompletion(ns), then DrainCompletions and DrainLosses, in one call (issue 38, a decomposition
  /// worker's step): 8-byte words in native byte order: InterruptedBy(), the two counts, then per completion (id,
  /// src, dst, size, startNs, endNs), per loss (flowId, offset, bytes). No struct per record crosses to Python.
  std::string StepToCompletion(int64_t ns);
  /// Run until no flow is in flight (Now() = last completion) or `limitNs`; true if idle.
  bool RunUntilIdle(int64_t limitNs);
  /// Run until every flow is also acknowledged at its sender, or `limitNs`; true if so.
  bool RunUntilQuiet(int64_t limitNs);
  /// The signal (SIGTERM 15, SIGINT 2) that cut a run call short, or 0.
  int InterruptedBy() const;

  std::vector<FlowRecord> DrainCompletions();
  std::vector<FctRecord> DrainFct();
  std::vector<PfcRecord> DrainPfc();
  std::vector<QueueSample> DrainQueueSamples();
  std::vector<DropRecord> DrainDrops();
  /// Packets trimmed since the last drain (empty with param trace_drops = 0).
  std::vector<TrimRecord> DrainTrims();
  /// Lost ranges of flows completed since the last drain (each flow's ranges when its last byte arrives).
  std::vector<LossRecord> DrainLosses();
  /// CNP events since the last drain (empty with param trace_cnp = 0).
  std::vector<CnpRecord> DrainCnps();
  /// CE-mark events since the last drain (empty with param trace_ecn = 0).
  std::vector<EcnRecord> DrainEcnMarks();
  /// A partition worker: the order key of the event that made each record of `kind` ("fct", "pfc", "drops",
  /// "trims", "cnps", "ecn") since the last call, in the records' order, flat (ns, schedTs, node, count, ...);
  /// empty in any other engine (it keeps none).
  std::vector<int64_t> DrainRecordKeys(const std::string& kind);
  std::vector<ChannelRecord> ChannelStats() const;
  /// Transport counters of every flow completed at its receiver so far, by id (final once its sender is done).
  std::vector<FlowTransportRecord> FlowTransport() const;
  /// A partition worker: what a flow's transport record needs when the run stops between its receiver's last byte
  /// and its sender's last ACK (one engine's record then has the sender's counters as of the last byte), flat and
  /// by id: per flow another worker sends whose last byte came here, [0, id, its DataComplete's key (ns, schedTs,
  /// node, count)]; per flow sent here and received elsewhere not done at its sender, [1, id, retransmitted packets,
  /// bytes, n, then n of (key (4 words), payload)]: its retransmissions since every byte was sent once. The driver
  /// takes off those after the last byte's key (`bridge.cut_pool.merged_transport`). Empty in any other engine.
  std::vector<int64_t> CutTransportTail() const;
  std::vector<std::pair<std::string, double>> Stats() const;
  /// The cut-link path (params partition.Groups, partition.Loopback): cables cut, lookahead ns, messages,
  /// message bytes, window barriers; all 0 when nothing is cut.
  std::vector<uint64_t> CutStats() const;

  // A partition worker (params partition.Groups and partition.Worker G; keyed mode): this engine runs group G's
  // nodes only. Its windows are driven by the caller, which exchanges the cut-link batches with the other workers
  // (phantora.netsim.cut_windows). Flows: each worker is given every flow (AddFlow, dependencies before their
  // dependents, before the first window) and keeps the ends it owns: the sender's start and its FCT record, the
  // receiver's completion; a dependency completed in another worker releases its dependent by a message.

  /// Run every event before `endNs` (one window); the clock stays at the last event run.
  void CutRunBefore(int64_t endNs);
  /// Run every event before `ns` and the events of `ns` scheduled before `ns` (those that order before any event
  /// scheduled at `ns`, such as the start of a flow released at `ns` by another worker).
  void CutRunThrough(int64_t ns);
  /// The least ns at which a flow another worker starts can be released by flows this worker starts (its
  /// dependencies), as two bounds: [0] over releases that land after their last dependency's completion ns (a
  /// delay or a later submit time), [1] over those that may land in that very ns; -1 for none. A flow waiting on
  /// several is released once the last completes: at the greatest of their completion bounds at the earliest.
  /// The windows end before them.
  /// `floorNs`: no dependency completes in another worker before it (the last window's start: a release not yet
  /// delivered was made in that window).
  std::vector<int64_t> CutReleaseBounds(int64_t floorNs);
  /// After a window from `floorNs`: put in the outboxes, for each flow with dependents this worker starts and
  /// another completes, its completion bound (as CutReleaseBounds takes it) when it rose since last sent; the
  /// completer's worker bounds the flow's dependents by it (where it knew only the last window's start).
  /// `floorNs` < 0: nothing (a warm-up call).
  void CutShareBounds(int64_t floorNs);
  /// Stepped partition workers (phantora.netsim.partition_stepped): the flows whose completion the driver reacts
  /// to, flat [id, ns, ...]: a completion at T lets it hand over a flow at T + ns at the earliest (its reaction).
  /// Replaces the last set, and forgets the last stop (CutReactBounds).
  void CutReacting(const std::vector<int64_t>& flat);
  /// [0]: the last ns every worker may run through before a flow of CutReacting that this worker starts and that
  /// is not complete may be reacted to: the least of its completion bound (FlowLb from `floorNs`, the last
  /// window's start) + its reaction; [1]: the least completion ns + reaction of those completed in this worker
  /// since CutReacting (the driver may hand over a flow then: every worker stops there); -1 for none.
  std::vector<int64_t> CutReactBounds(int64_t floorNs);
  /// The events of `ns` run in lockstep rounds from now on (each worker's records then carry the round, which
  /// orders them); `round` is the round that runs next (the same in every worker).
  void CutLockstep(int64_t ns, uint32_t round);
  /// A lockstep round: run the events of `ns` while they order before `limit` (the least key at `ns` of every
  /// other worker, (schedTs, node, count); empty: none), stopping after one that sends a release; the count run.
  uint64_t CutRunLeast(int64_t ns, const std::vector<int64_t>& limit);
  /// The next event's (ns, schedTs, node, count); empty if none.
  std::vector<int64_t> CutNextKey() const;
  /// Move the clock to `ns` (no event pending before it), as RunUntil(ns) leaves one engine.
  void CutAdvanceTo(int64_t ns);
  /// The batch of messages for group `group` since the last call (empty if none; bytes in a string, which
  /// cppyy hands to Python as bytes without a copy per element).
  std::string CutTakeOutbox(uint32_t group);
  /// CutTakeOutbox() for the C++ window loop, without a copy: `batch`'s old bytes are dropped and its buffer
  /// becomes the outbox (PhantoraCutLink::SwapOutbox), so swapping the same buffers grows none of them again.
  /// Returns the messages' bytes, `batch`'s first ones (its size may be larger: room kept, not zero-filled again).
  std::size_t CutSwapOutbox(uint32_t group, std::vector<uint8_t>& batch);
  /// The least arrival time of the messages taken since the last call, or -1.
  int64_t CutTakeMinArrival();
  /// A lower bound on the arrival at another worker of any cut-cable packet or release this worker sends from now
  /// on, before it is given new messages: the least over its pending events of their ns plus the least delay from
  /// their node to an arrival across a cut (PhantoraCutLink::Reach), and over the messages it sent since the last
  /// call of their arrival plus the same from the node they arrive at (what they can make the receiver send); -1
  /// for none. Every message sent in a window ends no earlier than the least of these over all workers, so the
  /// window may run to there (the earliest output time; at least the next event + the lookahead).
  int64_t CutOutputBound();
  /// Queue another worker's batch for this one.
  void CutDeliver(const std::string& batch);
  /// CutDeliver() of the `size` bytes at `data` (the C++ window loop: no copy).
  void CutDeliverBytes(const uint8_t* data, std::size_t size);
  /// Groups of the partition.
  uint32_t CutGroups() const;
  /// Queue sampling by owner (recorder.QueueSampleInterval > 0): each worker samples the switches it runs, at one
  /// engine's instants (from a flow start anywhere, every interval, until no worker has flows: a period; the next
  /// flow start begins another), each sample the last event of its ns. The ns this worker's period began at (a
  /// flow start here, or CutSampling's), -1 if none is on, -2 if it does not sample.
  int64_t CutSamplingFrom() const;
  /// -1 while this worker has flows, else the ns its last one left (flows are added between runs only, so within
  /// one they only leave).
  int64_t CutIdleSince() const;
  /// After a barrier: the period began at `fromNs` (>= 0; -1: none known) in some worker, which this one joins
  /// at the first instant at or after its clock; `othersBusy`: another worker still had flows (this one's sampler
  /// goes on); `idleNs` (-1: some worker has flows): every worker's last flow had left by then, and every event
  /// before `ranBefore` ran everywhere. True if the period ended (FabricRecorder::EndPeriod): the next flow start
  /// begins a new one.
  bool CutSampling(int64_t fromNs, bool othersBusy, int64_t idleNs, int64_t ranBefore);
  /// A run to the last completion (a replay's drain: one engine stops after the ns of its last completion, the
  /// last ACKs still on their way): {the flows this worker completes still in flight, a lower bound on the ns the
  /// last of the flows it has an end of completes at (LastSendEndBound, and each started flow's own progress; -1:
  /// none), valid for a flow another worker completed already too}.
  std::vector<int64_t> CutFinishBound();
  /// The next CutRunLeast stops right after the event in which this worker completes its `left`-th flow from now
  /// (the last one anywhere, in a lockstep round of a run to the last completion: one engine's drain stops there).
  void CutFinishAfter(int64_t left);

  int64_t Now() const;
  /// Time of the next pending event, or -1.
  int64_t NextEventTime() const;
  /// Time of the next pending event that is not cancelled, or -1.
  int64_t NextLiveEventTime();
  /// Flows added and not yet complete at their receiver.
  uint64_t InFlight() const;
  /// Channel ids a flow with this ECMP key and route (`viaNic`, as AddFlow's) takes (the switches' own tables
  /// and hash).
  std::vector<int64_t> Route(uint32_t src, uint32_t dst, uint64_t ecmpKey, bool viaNic = false);
  /// Base RTT of a path: 2 x propagation + one payload's serialisation per hop (as HPCC).
  uint64_t BaseRttNs(uint32_t src, uint32_t dst, uint64_t ecmpKey, bool viaNic = false);
  /// For every started flow not yet complete at its receiver, a lower bound on the ns it completes there: its
  /// bytes not yet sent once must still leave its NIC at line rate and then cross the least propagation of any
  /// route to its receiver, so Now() + those bytes x 8 / line rate + that propagation, less 2 ns for the ps
  /// rounding of the wire (headers, pacing, queues and pauses only come on top); at least Now() + 1.
  std::vector<FlowBound> CompletionBounds();
  /// A lower bound on the ns the last of the flows this engine sends completes at (-1: none left to send): each
  /// sender node must still put every byte of its flows not sent once (all of an unstarted flow's) on the ports
  /// their routes may leave it by, at most at those ports' summed line rate, and the last byte then crosses at
  /// least the least propagation of their routes, less 2 ns as in CompletionBounds (routes and rates as they are
  /// now: partition workers take no scenario events). Far above the greatest per-flow bound when a node sends
  /// many flows at once (an all-to-all): a stepped partition driver's last rounds run to it.
  int64_t LastSendEndBound();
  /// A stepped partition worker's round end in one call (issue 38): DrainCompletions, then DrainLosses, then
  /// CompletionBounds, packed as 8-byte words in native byte order: the three counts, then per completion (id, src,
  /// dst, size, startNs, endNs), per loss (flowId, offset, bytes), per bound (id, ns). One cppyy call and no
  /// struct per record (`Ns3Simulator.cut_round_end`).
  std::string CutRoundEnd();
  /// Pacing rate of an open queue pair (0 if not open).
  uint64_t FlowRateBps(uint64_t flowId) const;
  /// After Finalize: what the fabric runs by, as (key, text) pairs read back from its objects. First every
  /// attribute as ns-3 holds it: "fabric.A", "recorder.A", "nic.A" (every NIC has the same), "switch.A" (of a
  /// packet switch; an NVSwitch differs in NvSwitch only) and "cc.A" (a queue pair's CC object); then what the
  /// fabric-scaled defaults (an attribute's 0) resolved to: "switch/N/BufferBytes" for each packet switch N, and
  /// "switch/N/P/RateBps", ".../Kmin", ".../Kmax", ".../Pmax", ".../HeadroomBytes" for each port P of it.
  std::vector<std::pair<std::string, std::string>> EffectiveParams() const;
  void Close();

  class Impl;

 private:
  Impl& Need() const;
  /// The cut-link path of a partition worker; throws naming `what` if this engine is not one.
  PhantoraCutLink& Worker(const char* what) const;
  /// RunUntilWatched's loop over the watch set already in place (`all`: every flow is watched).
  bool RunWatching(int64_t ns, bool all, const char* caller);
  /// Process every event at or before `ns` (RunUntil, inside other run calls); `untilIdle`: stop right after a
  /// completion that leaves no flow in flight, if one comes first (where RunUntilIdle stops).
  void RunTo(int64_t ns, bool untilIdle = false);
  /// A run call's body, cut short by a signal: then InterruptedBy() is set and the result is `cut`.
  template <typename R, typename F>
  R Interruptible(R cut, F&& body);

  std::unique_ptr<Impl> m_impl;
};

}  // namespace ns3

#endif  // PHANTORA_NETWORK_H
