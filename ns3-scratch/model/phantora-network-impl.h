// PhantoraNetwork::Impl: what stands behind the facade (private to the model; not for cppyy).
#ifndef PHANTORA_NETWORK_IMPL_H
#define PHANTORA_NETWORK_IMPL_H

#include "fabric-installer.h"
#include "fabric-recorder.h"
#include "finished-flows.h"
#include "phantora-cut-link.h"
#include "phantora-fabric.h"
#include "phantora-network.h"

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ns3 {

/// The fabric (PhantoraFabric), its installer (FabricInstaller), its recorder (FabricRecorder),
/// and the flows: their dependencies, their start, their completion at both ends (phantora-flows.cc).
class PhantoraNetwork::Impl {
 public:
  struct FlowState {
    uint64_t id;
    uint32_t src, dst;
    uint64_t size;
    uint8_t prio;
    uint64_t key;
    bool viaNic;  ///< its route: through its endpoints' NICs (AddFlow), whatever its key
    int64_t submitNs;
    int64_t readyNs;
    int64_t delayNs;
    uint32_t pending = 0;
    int64_t startNs = -1;
    uint32_t sport = 0, dport = 100;
    bool dataDone = false;
    uint64_t lossBudget = 0;
    uint64_t maxRateBps = 0;  ///< rate cap, payload bits/s (SetMaxRate; 0 = none)
    uint64_t conn = 0;        ///< connection (SetConnection; 0 = a queue pair of its own)
    uint64_t queue = 0;       ///< its sender's queue (SetQueue; 0 = none)
    int64_t minPropNs = -1;  ///< least propagation to dst (CompletionBounds), once asked
    int64_t startAt = -1;    ///< the ns its start is queued for, once queued
    // A partition worker's flow with a dependency completed in another group (cross): its start takes the order
    // key of its last dependency's completion in one engine's order, (ns, that event's key, the key it took).
    bool cross = false;
    bool hasLast = false;
    int64_t lastNs = 0;
    PhantoraOrderKey lastEvent;
    uint32_t lastSeq = 0;
    PhantoraOrderKey lastKey;
    std::vector<uint64_t> deps;  ///< a partition worker's starter: its dependencies (release bounds)
    int64_t sentLb = -1;  ///< the completion bound last shared with its completer's worker (ShareBounds)
  };

  /// What every partition worker knows of every flow (for the dependencies between workers).
  struct DepInfo {
    uint32_t src;        ///< its sender: that node's worker starts it
    uint32_t completer;  ///< the node whose event completes it: its receiver, its sender if of no bytes or to itself
    bool cross;          ///< a dependency of it completes in another group than its sender's
    bool hasCross;       ///< a flow of another group's sender depends on it
    int64_t submitNs;
    int64_t delayNs;
    bool shared = false;  ///< in shareBounds (its sender's worker shares its completion bound)
  };
  /// A cross flow waiting on flows this worker starts: (its submit ns, its delay), for the release bounds.
  struct CrossDependent {
    int64_t submitNs;
    int64_t delayNs;
  };
  /// The flows this worker starts that complete in another group than the sender of a cross flow waiting on them
  /// all (a join): that flow is released no earlier than the last of them completes, so its release is bounded by
  /// the greatest of their completion bounds. Flows with one such set share it, each distinct pair once (an
  /// all-to-all after an all-to-all gives hundreds of flows one join).
  struct CrossJoin {
    std::vector<uint64_t> deps;           ///< not yet done here (CutReleaseBounds drops those done)
    std::vector<CrossDependent> waiting;  ///< distinct (submit, delay) of the flows waiting on them
  };

  Impl();

  /// The receiver holds every byte of the flow: record it, release its dependents.
  void DataComplete(uint64_t id);
  /// The sender has every byte acknowledged: the FCT record.
  void SenderDone(uint64_t id);
  void ScheduleStart(FlowState& f);
  /// A partition worker adds a flow whose sender another worker runs: take the caller's order count that one
  /// engine's ScheduleStart takes for it (flows reach a worker without dependencies: every one is started at
  /// AddFlow), so that every worker's caller keys are one engine's and records made by a start event (a flow of
  /// no bytes or to itself: its FCT record) merge in one engine's order.
  void SkipStartKey();
  void StartFlow(uint64_t id);
  /// The ns flow `f`'s start is due at (its dependencies' completion and its delay, stretched by throttles).
  int64_t StartTime(const FlowState& f) const;
  /// A partition worker at flow `id`'s AddFlow: record what it needs of the dependencies `deps` (every worker
  /// gets every flow); throws naming the flow for a dependency not added yet, or added after the windows began.
  void AddWorkerDeps(FlowState& f, uint32_t completer, const std::vector<uint64_t>& deps);
  /// A partition worker: dependency `dep` of flow `id` completed now, in this worker (DataComplete).
  void ReleaseFrom(uint64_t dep, uint64_t id);
  /// Flow `f` waits on crossJoins[join]: keep its (submit, delay) once there.
  void AddCrossDependent(std::size_t join, const FlowState& f);
  /// A partition worker starting cross flow `id`: one of its dependencies completed at `ns` in the event with
  /// key `event` (RunningKey; the `seq`-th its worker ran in that ns), which took `key` for the start; the last
  /// in one engine's order queues the start with its key. `remote`: from another worker (checked against the
  /// clock; one whose completion event was itself scheduled in that ns and that lands in it is refused).
  void Release(uint64_t id, int64_t ns, const PhantoraOrderKey& event, uint32_t seq, const PhantoraOrderKey& key,
               bool remote);
  /// The least ns a started flow of this engine completes at its receiver (CompletionBounds); `floor`: the least
  /// ns a completion at another worker's receiver not yet known here can have.
  int64_t CompletionLb(FlowState& f, int64_t now, int64_t floor);
  /// A lower bound on the ns flow `id` completes at, if not yet (a flow this worker does not start: `floor`, the
  /// least ns a completion not yet known here can have).
  int64_t FlowLb(uint64_t id, int64_t floor, std::unordered_map<uint64_t, int64_t>& memo);
  /// Flows not done (a partition worker: here or, as the last barrier said, in another worker).
  bool Busy() const { return !flows.empty() || othersBusy; }
  bool othersBusy = false;  ///< a partition worker: another worker had flows at the last barrier (CutSampling)
  int64_t emptySince = 0;   ///< the ns `flows` last became empty (CutIdleSince)
  int64_t finishAt = -1;    ///< CutRunLeast stops once inFlight is down to this (CutFinishAfter; -1: never)
  /// Forget flow `it` (done here); `now`: the ns, kept in emptySince if it was the last.
  void EraseFlow(std::unordered_map<uint64_t, FlowState>::iterator it, int64_t now) {
    flows.erase(it);
    if (flows.empty()) {
      emptySince = now;
    }
  }

  Ptr<PhantoraFabric> fabric;
  Ptr<FabricRecorder> recorder;
  FabricInstaller installer;
  bool finalized = false;
  bool simulatorBound = false;  ///< the fabric's "Simulator" is ns-3's simulator (from the first AddNode on)
  std::vector<uint32_t> cutGroups;      ///< param partition.Groups: a group per node (empty: no cut)
  bool cutLoopback = false;             ///< param partition.Loopback: every group in this engine
  uint32_t cutWorker = UINT32_MAX;      ///< param partition.Worker: the group this engine runs (else all)
  std::vector<uint32_t> cutIdle;        ///< param partition.Idle: nodes that carry no packet (fluid NVSwitches)
  bool workerStarted = false;           ///< a partition worker past Finalize: run calls are refused
  /// A partition worker: this engine runs group cutWorker's nodes only.
  bool Worker() const { return cutWorker != UINT32_MAX; }
  /// This engine runs node `node`'s events (always, unless a partition worker).
  bool Owns(uint32_t node) const { return cutWorker == UINT32_MAX || cutGroups[node] == cutWorker; }
  /// A worker's receiver `node` learns that flow `flow`'s sender is done (another worker's SenderDone).
  void ForgetAtReceiver(uint64_t flow, uint32_t node);
  std::unique_ptr<PhantoraCutLink> cut;  ///< the cut-link path, from Finalize on
  std::unordered_map<uint64_t, DepInfo> depInfo;  ///< a partition worker: every flow added
  std::vector<CrossJoin> crossJoins;  ///< a worker's started flows with cross dependents, by the joins they form
  std::map<std::vector<uint64_t>, std::size_t> crossJoinOf;  ///< a join's index by its sorted dependencies
  bool cutRan = false;  ///< a partition worker ran a window (a flow added after it: only pending dependencies)
  /// AddWorkerDeps' reading of the last deps list it took, for the next flow with an equal list and a sender of
  /// the same group, while nothing it read can have changed (no event run, no done message, the same cutRan): an
  /// all-to-all's flows that each wait on the whole previous all-to-all read the list once, not once a flow.
  struct DepsMemo {
    std::vector<uint64_t> deps;  ///< the list as given
    uint32_t group = UINT32_MAX;  ///< its flow's sender's group
    uint64_t events = 0;          ///< the simulator's event count, doneNotes and cutRan when it was read
    uint64_t notes = 0;
    bool cutRan = false;
    std::vector<uint64_t> distinct;                ///< each dependency once, in first-seen order
    std::vector<std::vector<uint64_t>*> waiting;  ///< dependents[d] of those this worker completes, in that order
    bool cross = false;                            ///< a dependency completes in another group
    std::size_t join = SIZE_MAX;                   ///< its crossJoins entry, or none
  };
  DepsMemo depsMemo;
  uint64_t doneNotes = 0;  ///< done messages taken (they change doneEnd between events)
  /// A worker's flows with dependents that it starts and another worker completes: their completion bounds go to
  /// that worker (ShareBounds), where FlowLb would know only the last window's start of them.
  std::vector<uint64_t> shareBounds;
  std::unordered_map<uint64_t, int64_t> sharedLb;  ///< flows completed here, started elsewhere: the shared bounds
  /// A worker's flows it starts whose last byte a switch queued (here, or in another worker, which sent it): the
  /// least ns that packet reaches the receiver (LastByteQueued), once every byte is sent (CompletionLb).
  std::unordered_map<uint64_t, int64_t> tailLb;
  /// A switch of this worker queued flow `flow`'s last byte (PfcSwitch::SetLastByteHook): it reaches node `next`
  /// at `arriveNs` at the earliest, then the least propagation to `dst`. Kept in tailLb by the sender's worker (a
  /// bound message if that is another).
  void LastByteQueued(uint64_t flow, uint32_t src, uint32_t dst, uint32_t next, int64_t arriveNs);
  /// Keep tailLb from now on, on a lossless fabric: a partition worker from Finalize, any other engine from its
  /// first CompletionBounds (a decomposition worker's driver bounds completions; a flow whose last byte was queued
  /// before is bounded by its first send only).
  void EnableTailBounds();
  bool tailBounds = false;  ///< EnableTailBounds ran
  /// Stepped partition workers: the flows the driver reacts to, by id: their reaction ns (CutReacting); the least
  /// completion ns + reaction of those completed here since (-1: none).
  std::unordered_map<uint64_t, int64_t> reacting;
  int64_t reactStop = -1;
  /// Send each flow of shareBounds whose completion bound rose above `floor` and what was sent before to its
  /// completer's worker; forget the flows done here.
  void ShareBounds(int64_t floor);

  std::unordered_map<uint64_t, FlowState> flows;  // submitted, not done at both ends
  std::unordered_map<uint64_t, std::vector<uint64_t>> dependents;
  DoneEnds doneEnd;  // receiver-complete flows (not a partition worker: a bit each once done at both ends)
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> nextSport;
  uint64_t inFlight = 0;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool stopWhenIdle = false;
  bool stopWhenQuiet = false;
  bool watching = false;  // RunUntilWatched: stop at the first watched completion
  bool watchHit = false;
  bool watchAll = false;  // RunUntilCompletion: every completion stops
  std::unordered_set<uint64_t> watched;
  /// A compute marker's delay from `readyNs` on `node`, stretched by the node's throttles (SetThrottle).
  int64_t Stretch(uint32_t node, int64_t readyNs, int64_t work) const;
  struct Throttle {
    int64_t startNs, endNs;  // endNs < 0: open
    double factor;
  };
  std::unordered_map<uint32_t, std::vector<Throttle>> throttles;  // by endpoint node
  std::unordered_set<uint64_t> unthrottled;                       // ExemptFromThrottle
  struct PendingThrottle {
    uint32_t node;
    int64_t durationNs;  // < 0: open
    double factor;
  };
  std::unordered_map<uint64_t, std::vector<PendingThrottle>> throttleOnDone;  // ThrottleFromFlow, by flow id
  std::vector<uint32_t> linkDown;  // per link: scenario failures not yet repaired (ScheduleLinkState)
  uint64_t linkEvents = 0;         // scenario events applied
  uint64_t reconvergences = 0;
  uint64_t reroutedFlows = 0;        // started flows whose route changed at a re-convergence
  uint64_t reroutedBytes = 0;        // their bytes not yet sent once, then
  std::vector<int64_t> rerouteLog;   // per re-convergence: ns, flows moved, bytes moved (RerouteLog)
  std::vector<int64_t> stallLog;     // ns, link (-1: a re-convergence), flows stalled (StallLog)
  std::unordered_set<uint64_t> blackholed;  // flows whose route crossed a failed link since the last re-convergence
  std::unordered_set<uint64_t> noRoute;     // flows a re-convergence (or their start) left with no route
  uint64_t stalls = 0;                      // flows that stopped: on a failed link's route, or with no route
  bool routesCut = false;                   // routing's view has links down (the last re-convergence)
  /// Started flows (not done) whose route crosses channel 2 x link or 2 x link + 1 and not yet counted as
  /// blackholed: count them as stalled (they blackhole until routing re-converges).
  uint64_t StallOnLink(uint32_t link);
  int interruptedBy = 0;  // the signal that cut a run call short (phantora-interrupt.h); 0 if none

  std::vector<FlowRecord> completions;
  std::vector<FctRecord> fcts;
  std::vector<RecordKey> fctKeys;  // a partition worker: each FCT record's event key (FabricRecorder::Keep)
  std::vector<LossRecord> losses;
  /// Completed at the receiver (sender's part final once done; not a partition worker: a bit each if then all 0).
  TransportTable transport;
  /// A partition worker, for a flow's transport record when the run stops between its receiver's last byte and
  /// its sender's last ACK (one engine's record then has the sender's counters as of the last byte,
  /// DataComplete): the key of that DataComplete for flows another worker sends, until their sender is done
  /// (ForgetAtReceiver), and each retransmission of a flow another worker receives sent after every byte was sent
  /// once (the only ones that can follow the last byte's arrival), with its event's key, until its sender is done.
  std::unordered_map<uint64_t, RecordKey> dataDoneKey;
  std::unordered_map<uint64_t, std::vector<std::pair<RecordKey, uint32_t>>> tailRetx;
  /// A NIC's "Retransmit" trace, a partition worker's senders: kept in tailRetx if its receiver is elsewhere.
  void Retransmitted(uint64_t flow, uint32_t payload, bool allSentOnce);
};

}  // namespace ns3

#endif  // PHANTORA_NETWORK_IMPL_H
