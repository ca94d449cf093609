// PhantoraNetwork: flows, their dependencies and completions, and running the simulator in windows.
#include "phantora-network-impl.h"

#include "phantora-interrupt.h"
#include "phantora-scheduler.h"
#include "phantora-simulator-impl.h"

#include "ns3/log.h"
#include "ns3/make-event.h"
#include "ns3/simulator.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <stdexcept>
#include <string>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraFlows");

namespace {

/// Now in ns: the keyed simulator's clock read directly (ns resolution, Finalize checks), else Simulator::Now().
int64_t NowNs() {
  const PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  return sim ? static_cast<int64_t>(sim->NowStep()) : Simulator::Now().GetNanoSeconds();
}

/// A signal stopped Simulator::Run() (after the event in progress).
struct Interrupted {
  int signal;
};

/// Simulator::Run(), stopped by SIGTERM / SIGINT (handlers installed by Interruptible): then it throws Interrupted.
void RunSimulator() {
  Simulator::Run();
  if (const int sig = TakeInterrupt()) {
    throw Interrupted{sig};
  }
}

/// Run until `done()` (the event handlers stop the simulator when `flag` is set and it holds) or `limitNs`;
/// true if done.
template <typename Done>
bool RunFlagged(int64_t limitNs, bool& flag, Done done, const char* caller) {
  if (done()) {
    return true;
  }
  const int64_t now = NowNs();
  if (limitNs < now) {
    throw std::invalid_argument(std::string(caller) + ": limit is in the past");
  }
  flag = true;
  EventId stop = Simulator::Stop(NanoSeconds(limitNs - now));
  RunSimulator();
  flag = false;
  Simulator::Cancel(stop);
  return done();
}

/// Stop after every event of time step `ns` (now). In the keyed mode with the key after every other of the step
/// (StepEndKey): a queue sample of `ns` orders after any stop the caller can queue with its own key, so a loop of
/// such stops would run one stop each time and never the sample (issue 38: a keyed run with the default 1 us
/// sampling that met a sampling instant spun here, queueing stops until it ran out of memory).
EventId StopAtStepEnd(int64_t ns) {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  if (sim == nullptr || !sim->Keyed()) {
    return Simulator::Stop(NanoSeconds(0));
  }
  const auto ts = static_cast<uint64_t>(ns);
  return sim->ScheduleKeyedAt(ts, Simulator::NO_CONTEXT, StepEndKey(ts),
                              MakeEvent(static_cast<void (*)()>(&Simulator::Stop)));
}

std::string SignalName(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal " + std::to_string(sig);
}

}  // namespace

PhantoraNetwork::Impl::Impl() : fabric(CreateObject<PhantoraFabric>()), recorder(CreateObject<FabricRecorder>()) {}

void PhantoraNetwork::Impl::DataComplete(uint64_t id) {
  auto it = flows.find(id);
  if (it == flows.end() || it->second.dataDone) {
    return;
  }
  FlowState& f = it->second;
  f.dataDone = true;
  const int64_t now = NowNs();
  if (f.startNs < 0) {  // a worker with the receiver only: the start, as the sender's worker runs it
    f.startNs = std::max(f.submitNs, f.readyNs) + f.delayNs;
  }
  completions.push_back(FlowRecord{f.id, f.src, f.dst, f.size, f.startNs, now});
  if (f.lossBudget && f.src != f.dst) {
    for (const auto& [offset, bytes] : fabric->GetNode(f.dst).nic->TakeLost(id)) {
      losses.push_back(LossRecord{id, offset, bytes});
    }
  }
  if (f.size > 0 && f.src != f.dst) {
    FlowTransportStats t = fabric->GetNode(f.dst).nic->RxStats(id);
    if (Owns(f.src)) {  // else the sender's worker has them (SenderDone; before it, as of now: dataDoneKey)
      const FlowTransportStats tx = fabric->GetNode(f.src).nic->TxStats(id);
      t.retxPackets = tx.retxPackets;
      t.retxBytes = tx.retxBytes;
    } else {
      dataDoneKey[id] = RunningRecordKey();
    }
    transport[id] = t;
  }
  doneEnd[id] = now;
  if (!reacting.empty()) {
    const auto r = reacting.find(id);
    if (r != reacting.end() && (reactStop < 0 || now + r->second < reactStop)) {
      reactStop = now + r->second;
    }
  }
  --inFlight;
  ++completed;
  auto pending = throttleOnDone.find(id);
  if (pending != throttleOnDone.end()) {  // a slow GPU opens now, before the dependents below start
    for (const PendingThrottle& p : pending->second) {
      throttles[p.node].push_back({now, p.durationNs < 0 ? -1 : now + p.durationNs, p.factor});
      NS_LOG_LOGIC("flow " << id << " done: node " << p.node << " computes x" << p.factor << " from " << now);
    }
    throttleOnDone.erase(pending);
  }
  auto dit = dependents.find(id);
  if (dit != dependents.end() && Worker()) {
    for (uint64_t j : dit->second) {
      ReleaseFrom(id, j);
    }
    dependents.erase(dit);
  } else if (dit != dependents.end()) {
    for (uint64_t j : dit->second) {
      FlowState& g = flows.at(j);
      g.readyNs = std::max(g.readyNs, now);
      if (--g.pending == 0) {
        ScheduleStart(g);
      }
    }
    dependents.erase(dit);
  }
  if (watching && (watchAll || watched.count(id))) {
    // Stop after this event; RunUntilWatched then runs the rest of this ns.
    NS_LOG_LOGIC("watched flow " << id << " completed at " << now << " ns: stopping");
    watching = false;
    watchHit = true;
    Simulator::Stop();
  }
  if (stopWhenIdle && inFlight == 0) {
    Simulator::Stop();
  }
  if (!Owns(f.src)) {  // a worker with the receiver only: nothing more happens to this flow here
    sharedLb.erase(id);
    const auto info = depInfo.find(id);
    if (info != depInfo.end() && info->second.hasCross) {  // its sender's worker stops bounding its completion
      cut->SendDone(id, f.src, static_cast<uint64_t>(now));
    }
    EraseFlow(it, now);
  }
}

void PhantoraNetwork::Impl::AddWorkerDeps(FlowState& f, uint32_t completer, const std::vector<uint64_t>& deps) {
  const uint32_t group = cutGroups[f.src];
  const uint64_t events = PhantoraSimulatorImpl::Current()->GetEventCount();
  DepsMemo& m = depsMemo;
  if (deps.size() > 1 && m.group == group && m.events == events && m.notes == doneNotes && m.cutRan == cutRan &&
      m.deps == deps) {
    // The same list as the last flow's, nothing it read changed since: what it found holds for this flow too.
    f.cross = f.cross || m.cross;
    for (std::vector<uint64_t>* w : m.waiting) {
      w->push_back(f.id);
    }
    if (m.join != SIZE_MAX) {
      AddCrossDependent(m.join, f);
    }
    if (Owns(f.src)) {
      f.pending = static_cast<uint32_t>(m.distinct.size());
      f.deps = m.distinct;
    }
    depInfo[f.id] = DepInfo{f.src, completer, f.cross, false, f.submitNs, f.delayNs};
    return;
  }
  const std::string where = "flow " + std::to_string(f.id) + ": ";
  // Each dependency once, in first-seen order: a sorted copy says whether any repeats (a wide deps list, as an
  // all-to-all's, usually has none); a linear search per id was quadratic in the list's length.
  std::vector<uint64_t> distinct(deps);
  std::sort(distinct.begin(), distinct.end());
  if (std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end()) {
    distinct = deps;
  } else {
    distinct.clear();
    std::unordered_set<uint64_t> seen;
    for (uint64_t d : deps) {
      if (seen.insert(d).second) {
        distinct.push_back(d);
      }
    }
  }
  // After the first window a stepped driver (phantora.netsim.partition_stepped) adds flows at the workers' common
  // clock with the dependencies still pending in every worker only (it drops those completed by then, as one
  // engine finds them done): one this worker knows completed is refused.
  for (uint64_t d : distinct) {
    if (cutRan && doneEnd.count(d)) {
      throw std::invalid_argument(where + "depends on flow " + std::to_string(d) +
                                  ", completed already (a partition worker takes a flow with dependencies after its "
                                  "first window only with dependencies still pending)");
    }
  }
  bool cross = false;
  for (uint64_t d : distinct) {
    const auto it = depInfo.find(d);
    if (it == depInfo.end()) {
      throw std::invalid_argument(where + "depends on flow " + std::to_string(d) +
                                  ", not added before it (a partition worker needs its dependencies first)");
    }
    cross = cross || cutGroups[it->second.completer] != group;
  }
  f.cross = f.cross || cross;
  std::vector<std::vector<uint64_t>*> waiting;
  std::vector<uint64_t> join;  // those this worker starts whose completion releases f from another group
  for (uint64_t d : distinct) {
    DepInfo& di = depInfo.at(d);
    if (Owns(di.completer)) {
      std::vector<uint64_t>& w = dependents[d];
      w.push_back(f.id);
      waiting.push_back(&w);
    }
    if (Owns(di.src) && !Owns(di.completer) && !di.shared) {  // its completer's worker bounds its dependents
      di.shared = true;
      shareBounds.push_back(d);
    }
    if (cutGroups[di.completer] != group) {
      di.hasCross = true;
      if (Owns(di.src)) {
        join.push_back(d);
      }
    }
  }
  std::size_t joinAt = SIZE_MAX;
  if (!join.empty()) {  // CutReleaseBounds reads each join's distinct (submit, delay) pairs: keep each once
    std::sort(join.begin(), join.end());
    const auto [at, added] = crossJoinOf.emplace(join, crossJoins.size());
    if (added) {
      crossJoins.push_back(CrossJoin{std::move(join), {}});
    }
    joinAt = at->second;
    AddCrossDependent(joinAt, f);
  }
  if (Owns(f.src)) {
    f.pending = static_cast<uint32_t>(distinct.size());
    f.deps = distinct;
  }
  depInfo[f.id] = DepInfo{f.src, completer, f.cross, false, f.submitNs, f.delayNs};
  // dependents' vectors stay where they are while no event runs (none is erased; a rehash moves no element)
  m = DepsMemo{deps, group, events, doneNotes, cutRan, std::move(distinct), std::move(waiting), cross, joinAt};
}

void PhantoraNetwork::Impl::AddCrossDependent(std::size_t join, const FlowState& f) {
  std::vector<CrossDependent>& js = crossJoins[join].waiting;
  const CrossDependent j{f.submitNs, f.delayNs};
  if (std::none_of(js.begin(), js.end(), [&j](const CrossDependent& k) {
        return k.submitNs == j.submitNs && k.delayNs == j.delayNs;
      })) {
    js.push_back(j);
  }
}

void PhantoraNetwork::Impl::ReleaseFrom(uint64_t dep, uint64_t id) {
  const DepInfo& j = depInfo.at(id);
  const int64_t now = NowNs();
  if (!Owns(j.src)) {  // another worker starts it: the keys one engine's ScheduleStart would take, as a message
    PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
    const PhantoraOrderKey event = sim->RunningKey();
    const PhantoraOrderKey key = sim->TakeKey();
    const int64_t land = std::max(now, j.submitNs) + (throttles.empty() ? j.delayNs : 0);
    cut->SendRelease(id, j.src, static_cast<uint64_t>(now), event, sim->RanAtNow(), key,
                     static_cast<uint64_t>(land));
    return;
  }
  if (j.cross) {
    PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
    const PhantoraOrderKey event = sim->RunningKey();
    Release(id, now, event, sim->RanAtNow(), sim->TakeKey(), false);
    return;
  }
  FlowState& g = flows.at(id);  // every dependency completes here: as one engine
  g.readyNs = std::max(g.readyNs, now);
  if (--g.pending == 0) {
    ScheduleStart(g);
  }
}

namespace {
/// (ns, event key, events run in that ns in its worker) of a release: the last in one engine's order starts the
/// flow. Two workers never run events of one key; one worker's releases of one key (an event and those that ran
/// right after it, before its key) go by its count.
bool ReleaseBefore(int64_t ns, const PhantoraOrderKey& event, uint32_t seq, int64_t ns2,
                   const PhantoraOrderKey& event2, uint32_t seq2) {
  if (ns != ns2) {
    return ns < ns2;
  }
  if (KeyBefore(event, event2) || KeyBefore(event2, event)) {
    return KeyBefore(event, event2);
  }
  return seq < seq2;
}
}  // namespace

void PhantoraNetwork::Impl::Release(uint64_t id, int64_t ns, const PhantoraOrderKey& event, uint32_t seq,
                                    const PhantoraOrderKey& key, bool remote) {
  auto it = flows.find(id);
  if (it == flows.end() || it->second.pending == 0) {
    throw std::runtime_error("flow " + std::to_string(id) + ": a release for a flow this partition worker does not "
                             "wait to start");
  }
  FlowState& g = it->second;
  g.readyNs = std::max(g.readyNs, ns);
  if (!g.hasLast || ReleaseBefore(g.lastNs, g.lastEvent, g.lastSeq, ns, event, seq)) {
    g.hasLast = true;
    g.lastNs = ns;
    g.lastEvent = event;
    g.lastSeq = seq;
    g.lastKey = key;
  }
  if (--g.pending > 0) {
    return;
  }
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const int64_t at = StartTime(g);
  const bool lockstep = sim->Lockstep(static_cast<uint64_t>(at));  // one worker at a time: in order by construction
  if (remote && !lockstep && at == g.lastNs && g.lastEvent.schedTs == static_cast<uint64_t>(at)) {
    throw std::runtime_error("flow " + std::to_string(id) + ": released at " + std::to_string(at) +
                             " ns with no delay by an event scheduled in that very ns in another partition worker "
                             "(a chain of one ns across workers: not split exactly yet; run it on one engine)");
  }
  if (remote && (at < NowNs() || (!lockstep && sim->RanPast(static_cast<uint64_t>(at), g.lastKey)))) {
    throw std::runtime_error("flow " + std::to_string(id) + ": its last dependency's release (completed at " +
                             std::to_string(ns) + " ns in another partition worker) starts it at " +
                             std::to_string(at) + " ns, behind its worker's clock (" + std::to_string(NowNs()) +
                             " ns): a window ran too far");
  }
  g.startAt = at;
  sim->ScheduleKeyedAt(static_cast<uint64_t>(at), g.src, g.lastKey, MakeEvent(&Impl::StartFlow, this, id));
}

int64_t PhantoraNetwork::Impl::CompletionLb(FlowState& f, int64_t now, int64_t floor) {
  // Not yet complete at a receiver this engine runs: after now. At another worker's receiver it may have completed
  // since `floor` already, unless bytes are still to send.
  int64_t ns = Owns(f.dst) ? now + 1 : floor;
  uint64_t sent = 0;
  uint64_t bps = 0;
  if (f.size > 0 && f.src != f.dst && fabric->GetNode(f.src).nic->SendProgress(f.id, sent, bps) && bps > 0) {
    if (f.minPropNs < 0) {
      f.minPropNs = static_cast<int64_t>(fabric->MinPropagationNs(f.src, f.dst));
    }
    // The last byte is not sent yet: it leaves the NIC once every unsent byte has (from Now() - 1 at the
    // earliest: a packet may start up to 999 ps back to back with the previous one), then propagates.
    const uint64_t unsent = f.size - std::min(sent, f.size);
    if (unsent > 0) {
      const auto txNs = static_cast<int64_t>(static_cast<unsigned __int128>(unsent) * 8'000'000'000ULL / bps);
      ns = std::max(ns, now - 2 + txNs + f.minPropNs);
    } else {
      // Every byte sent: the receiver completes on a packet with the last byte, which left no earlier than that
      // byte's first send (a resend of it is later) and arrives at least the least propagation after it.
      const int64_t last = fabric->GetNode(f.src).nic->LastByteSentNs(f.id);
      if (last >= 0) {
        ns = std::max(ns, last - 1 + f.minPropNs);
      }
      // Better, once a switch queued that packet: it leaves there after the bytes ahead of it (LastByteQueued).
      const auto tail = tailLb.find(f.id);
      if (tail != tailLb.end()) {
        ns = std::max(ns, tail->second);
      }
    }
  }
  return ns;
}

int64_t PhantoraNetwork::Impl::FlowLb(uint64_t id, int64_t floor, std::unordered_map<uint64_t, int64_t>& memo) {
  const auto done = doneEnd.find(id);
  if (done != doneEnd.end()) {
    return done->second;
  }
  const auto it = flows.find(id);
  if (it == flows.end() || !Owns(it->second.src)) {
    // Another worker starts it: what its sender's worker shared of it (ShareBounds), if it completes here.
    const auto shared = sharedLb.find(id);
    return shared == sharedLb.end() ? floor : std::max(floor, shared->second);
  }
  FlowState& f = it->second;
  if (f.startNs >= 0) {  // its own progress alone, read afresh at no more cost than a memo: not kept there
    return CompletionLb(f, NowNs(), floor);
  }
  const auto m = memo.find(id);
  if (m != memo.end()) {
    return m->second;
  }
  const int64_t network = f.size > 0 && f.src != f.dst ? 1 : 0;
  int64_t lb;
  if (f.startAt >= 0) {
    lb = f.startAt + network;
  } else {
    lb = std::max({f.submitNs, f.readyNs, floor});
    for (uint64_t d : f.deps) {
      lb = std::max(lb, FlowLb(d, floor, memo));
    }
    lb += (throttles.empty() ? f.delayNs : 0) + network;
  }
  memo[id] = lb;
  return lb;
}

void PhantoraNetwork::Impl::LastByteQueued(uint64_t flow, uint32_t src, uint32_t dst, uint32_t next,
                                           int64_t arriveNs) {
  const int64_t ns = arriveNs + (next == dst ? 0 : static_cast<int64_t>(fabric->MinPropagationNs(next, dst)));
  if (!Owns(src)) {
    cut->SendBound(flow, src, static_cast<uint64_t>(std::max<int64_t>(ns, 0)));
  } else if (flows.count(flow)) {
    int64_t& lb = tailLb[flow];
    lb = std::max(lb, ns);
  }
}

void PhantoraNetwork::Impl::EnableTailBounds() {
  if (tailBounds) {
    return;
  }
  tailBounds = true;
  // Completion bounds from where a flow's last byte waits, when no packet can be lost: every packet switch this
  // engine runs reports it (the NICs mark it), and the sender's engine keeps the bound (LastByteQueued).
  bool lossless = true;
  for (uint32_t n = 0; n < fabric->NumNodes(); ++n) {
    const Ptr<PfcSwitch>& sw = fabric->GetNode(n).sw;
    lossless = lossless && (!sw || fabric->GetNode(n).kind != NodeKind::Switch || sw->Lossless());
  }
  for (uint32_t n = 0; lossless && n < fabric->NumNodes(); ++n) {
    const auto& node = fabric->GetNode(n);
    if (node.nic) {
      node.nic->MarkLastByte(true);
    }
    if (node.sw && node.kind == NodeKind::Switch && Owns(n)) {
      node.sw->SetLastByteHook([this](uint64_t flow, uint32_t src, uint32_t dst, uint32_t next, int64_t at) {
        LastByteQueued(flow, src, dst, next, at);
      });
    }
  }
}

void PhantoraNetwork::Impl::ShareBounds(int64_t floor) {
  std::unordered_map<uint64_t, int64_t> memo;
  std::size_t keep = 0;
  for (const uint64_t id : shareBounds) {
    const auto it = flows.find(id);
    if (it == flows.end() || doneEnd.count(id)) {
      continue;  // done at its receiver, or at both ends
    }
    shareBounds[keep++] = id;
    const int64_t lb = FlowLb(id, floor, memo);
    if (lb > floor && lb > it->second.sentLb) {
      it->second.sentLb = lb;
      cut->SendBound(id, depInfo.at(id).completer, static_cast<uint64_t>(lb));
    }
  }
  shareBounds.resize(keep);
}

void PhantoraNetwork::Impl::ForgetAtReceiver(uint64_t flow, uint32_t node) {
  fabric->GetNode(node).nic->ForgetFlow(flow);
  dataDoneKey.erase(flow);  // the sender's worker has its final counters
}

void PhantoraNetwork::Impl::Retransmitted(uint64_t flow, uint32_t payload, bool allSentOnce) {
  if (!allSentOnce) {  // before the last byte's first send: before the receiver can have every byte
    return;
  }
  const auto it = flows.find(flow);
  if (it != flows.end() && !Owns(it->second.dst)) {
    tailRetx[flow].emplace_back(RunningRecordKey(), payload);
  }
}

void PhantoraNetwork::Impl::SenderDone(uint64_t id) {
  auto it = flows.find(id);
  if (it == flows.end()) {
    return;
  }
  const FlowState& f = it->second;
  const int64_t now = NowNs();
  fcts.push_back(FctRecord{f.id, f.src, f.dst, f.sport, f.dport, f.size, f.startNs, now - f.startNs,
                           fabric->StandaloneNs(f.src, f.dst, f.key, f.viaNic, f.size, f.maxRateBps)});
  recorder->Keep(fctKeys);
  if (f.src != f.dst && f.size > 0) {  // (an empty flow never reached its receiver and has no transport record)
    const FlowTransportStats tx = fabric->GetNode(f.src).nic->TxStats(id, true);
    if (Owns(f.dst)) {
      fabric->GetNode(f.dst).nic->ForgetFlow(id);
      if (FlowTransportStats* t = transport.Find(id)) {
        t->retxPackets = tx.retxPackets;
        t->retxBytes = tx.retxBytes;
      }
    } else {
      // The receiver is another worker's: it forgets the flow when this message reaches it, at the next
      // barrier (one engine does it now; see docs/packet-model.md for what that can change). The sender's
      // counters are this worker's part of the flow's transport record; the driver adds the receiver's.
      cut->SendForget(id, f.dst, static_cast<uint64_t>(now));
      FlowTransportStats t{};
      t.retxPackets = tx.retxPackets;
      t.retxBytes = tx.retxBytes;
      transport[id] = t;
    }
  }
  tailLb.erase(id);
  tailRetx.erase(id);
  EraseFlow(it, now);
  if (!Worker()) {  // done at both ends: what stays of it for the run, a bit each where it can
    doneEnd.Forget(id);
    transport.Final(id);
  }
  if (stopWhenQuiet && flows.empty()) {
    Simulator::Stop();
  }
}

int64_t PhantoraNetwork::Impl::Stretch(uint32_t node, int64_t readyNs, int64_t work) const {
  const auto it = throttles.find(node);
  if (it == throttles.end() || work <= 0) {
    return work;
  }
  const std::vector<Throttle>& ws = it->second;
  std::vector<int64_t> edges;
  for (const Throttle& w : ws) {
    for (int64_t e : {w.startNs, w.endNs}) {
      if (e > readyNs) {
        edges.push_back(e);
      }
    }
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  double t = static_cast<double>(readyNs);
  double left = static_cast<double>(work);
  for (std::size_t i = 0;; ++i) {
    double f = 1.0;
    for (const Throttle& w : ws) {
      if (w.startNs <= t && (w.endNs < 0 || t < w.endNs)) {
        f *= w.factor;
      }
    }
    if (i == edges.size() || left * f <= static_cast<double>(edges[i]) - t) {
      return static_cast<int64_t>(std::ceil(t + left * f - 1e-9)) - readyNs;
    }
    left -= (static_cast<double>(edges[i]) - t) / f;
    t = static_cast<double>(edges[i]);
  }
}

int64_t PhantoraNetwork::Impl::StartTime(const FlowState& f) const {
  const int64_t ready = std::max(f.submitNs, f.readyNs);
  const bool marker = f.size == 0 && f.src == f.dst && f.delayNs > 0 && !throttles.empty();
  const int64_t delay = marker && !unthrottled.count(f.id) ? Stretch(f.src, ready, f.delayNs) : f.delayNs;
  return ready + delay;
}

void PhantoraNetwork::Impl::ScheduleStart(FlowState& f) {
  const int64_t at = StartTime(f);
  f.startAt = at;
  const Time in = NanoSeconds(std::max<int64_t>(at - NowNs(), 0));
  const PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  if (sim && sim->Keyed()) {
    // The keyed mode: the start is its sender's event whoever scheduled it (the caller's context is the last
    // event run, which a partition worker cannot know), so what it schedules takes the sender's order counts.
    Simulator::ScheduleWithContext(f.src, in, &Impl::StartFlow, this, f.id);
  } else {
    Simulator::Schedule(in, &Impl::StartFlow, this, f.id);
  }
}

void PhantoraNetwork::Impl::SkipStartKey() {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  if (Worker() && sim && sim->Keyed()) {
    sim->TakeKey();
  }
}

void PhantoraNetwork::Impl::StartFlow(uint64_t id) {
  FlowState& f = flows.at(id);
  f.startNs = NowNs();
  if (f.size == 0 || f.src == f.dst) {
    DataComplete(id);
    SenderDone(id);
    return;
  }
  if (Owns(f.dst)) {  // else the receiver's worker expects it (AddFlow)
    fabric->GetNode(f.dst).nic->ExpectFlow(id, f.size, f.lossBudget);
  }
  const Ptr<RdmaNic>& nic = fabric->GetNode(f.src).nic;
  nic->StartFlow(QpSpec{id, f.dst, f.size, f.prio, f.key, f.viaNic, f.lossBudget, f.maxRateBps, f.conn, f.queue});
  if (!linkDown.empty() || routesCut) {  // a scenario: a flow may start with no route, or onto a failed link
    if (nic->Stalled(id)) {
      stalls += noRoute.insert(id).second ? 1 : 0;
    } else {
      const std::vector<int64_t> path = fabric->GetRoutes()->Path(f.src, f.dst, f.key, f.viaNic);
      if (std::any_of(path.begin(), path.end(), [this](int64_t c) { return linkDown.at(c / 2) > 0; }) &&
          blackholed.insert(id).second) {
        ++stalls;
      }
    }
  }
  recorder->StartSampling(MakeCallback(&Impl::Busy, this));
}

// ----- facade: flows and running ----------------------------------------------------------------

void PhantoraNetwork::AddFlow(uint64_t id, uint32_t src, uint32_t dst, uint64_t sizeBytes, int64_t startNs,
                              uint32_t priority, uint64_t ecmpKey, const std::vector<uint64_t>& deps, int64_t delayNs,
                              uint32_t dport, bool viaNic) {
  Impl& s = Need();
  const std::string where = "flow " + std::to_string(id) + ": ";
  if (!s.finalized) {
    throw std::runtime_error(where + "AddFlow before Finalize()");
  }
  if (s.flows.count(id) || s.doneEnd.count(id)) {
    throw std::invalid_argument(where + "duplicate flow id");
  }
  for (uint32_t end : {src, dst}) {
    if (end >= s.fabric->NumNodes() || !IsEndpoint(s.fabric->GetNode(end).kind)) {
      throw std::invalid_argument(where + "node " + std::to_string(end) + " is not an endpoint");
    }
  }
  if (priority < 1 || priority >= kNumPrio) {
    throw std::invalid_argument(where + "priority must be 1..7 (class 0 is for control), got " +
                                std::to_string(priority));
  }
  const int64_t now = NowNs();
  if (startNs < now) {
    throw std::invalid_argument(where + "starts at " + std::to_string(startNs) + " ns, before now (" +
                                std::to_string(now) + " ns)");
  }
  if (delayNs < 0) {
    throw std::invalid_argument(where + "delay must be >= 0");
  }
  if (src != dst && !s.routesCut && !s.fabric->GetRoutes()->Reachable(src, dst, viaNic)) {  // cut: it stalls
    throw std::invalid_argument(where + "no route from " + std::to_string(src) + " to " + std::to_string(dst) +
                                (viaNic ? " through the NICs (viaNic)" : ""));
  }
  Impl::FlowState f;
  f.id = id;
  f.src = src;
  f.dst = dst;
  f.size = sizeBytes;
  f.prio = static_cast<uint8_t>(priority);
  f.key = ecmpKey;
  f.viaNic = viaNic;
  f.submitNs = startNs;
  f.readyNs = startNs;
  f.delayNs = delayNs;
  if (s.fabric->GetRoutes()->GetEcmpHash() == EcmpHashKind::Hpcc) {
    f.sport = static_cast<uint32_t>(ecmpKey & 0xffff);  // the ports the switches hash
    f.dport = static_cast<uint32_t>((ecmpKey >> 16) & 0xffff);
  } else {
    f.dport = dport;
    f.sport = 10000 + s.nextSport[{src, dst}]++;
  }
  const uint32_t completer = sizeBytes == 0 || src == dst ? src : dst;  // the node whose event completes it
  if (s.Worker()) {
    s.AddWorkerDeps(f, completer, deps);
    if (!s.Owns(src) && !s.Owns(completer)) {  // a worker without either end (its sport is counted above)
      if (deps.empty()) {
        s.SkipStartKey();
      }
      return;
    }
  }
  std::unordered_set<uint64_t> seen;
  for (uint64_t d : s.Worker() ? std::vector<uint64_t>{} : deps) {
    if (!seen.insert(d).second) {
      continue;
    }
    auto done = s.doneEnd.find(d);
    if (done != s.doneEnd.end()) {
      f.readyNs = std::max(f.readyNs, done->second);
    } else if (!s.doneEnd.Forgotten(d)) {  // (done at both ends: it ended before now, so before startNs)
      s.dependents[d].push_back(id);
      ++f.pending;
    }
  }
  auto [it, ok] = s.flows.emplace(id, f);
  ++s.submitted;
  if (s.Owns(completer)) {  // in flight: until it completes (at its receiver)
    ++s.inFlight;
  }
  if (!s.Owns(src)) {  // the receiver only: expect it now (no packet of it can arrive before it starts)
    s.fabric->GetNode(dst).nic->ExpectFlow(id, f.size, f.lossBudget);
    if (deps.empty()) {
      s.SkipStartKey();
    }
  } else if (it->second.pending == 0) {
    s.ScheduleStart(it->second);
  }
}

namespace {
/// The flow `id`, waiting to start, that a setter `verb` changes; nullptr on a partition worker with neither end
/// of it (nothing to set there); throws if it is unknown or started.
PhantoraNetwork::Impl::FlowState* Waiting(PhantoraNetwork::Impl& s, uint64_t id, const char* verb) {
  auto it = s.flows.find(id);
  if (it == s.flows.end() && s.Worker() && s.depInfo.count(id)) {
    return nullptr;  // a partition worker with neither end of it
  }
  if (it == s.flows.end() || it->second.startNs >= 0) {
    throw std::invalid_argument("flow " + std::to_string(id) + ": " + verb + " on a flow not waiting to start");
  }
  return &it->second;
}
}  // namespace

void PhantoraNetwork::SetLossBudget(uint64_t id, uint64_t bytes) {
  Impl& s = Need();
  Impl::FlowState* f = Waiting(s, id, "SetLossBudget");
  if (f == nullptr) {
    return;
  }
  f->lossBudget = std::min(bytes, f->size);
  if (!s.Owns(f->src)) {  // a worker with the receiver only: it expects the flow already
    s.fabric->GetNode(f->dst).nic->ExpectFlow(id, f->size, f->lossBudget);
  }
}

void PhantoraNetwork::SetMaxRate(uint64_t id, uint64_t bps) {
  if (Impl::FlowState* f = Waiting(Need(), id, "SetMaxRate")) {
    NS_LOG_FUNCTION(this << id << bps);
    f->maxRateBps = bps;
  }
}

void PhantoraNetwork::SetConnection(uint64_t id, uint64_t conn) {
  if (Impl::FlowState* f = Waiting(Need(), id, "SetConnection")) {
    NS_LOG_FUNCTION(this << id << conn);
    f->conn = conn;
  }
}

void PhantoraNetwork::SetQueue(uint64_t id, uint64_t queue) {
  if (Impl::FlowState* f = Waiting(Need(), id, "SetQueue")) {
    NS_LOG_FUNCTION(this << id << queue);
    f->queue = queue;
  }
}

template <typename R, typename F>
R PhantoraNetwork::Interruptible(R cut, F&& body) {
  Impl& s = Need();
  if (s.Worker() && s.workerStarted) {
    throw std::runtime_error("a partition worker (partition.Worker) runs in windows driven by its caller "
                             "(CutRunBefore, CutAdvanceTo), not by the run calls");
  }
  if (s.interruptedBy) {
    throw std::runtime_error("this network was interrupted by " + SignalName(s.interruptedBy) +
                             " part-way through a run call; close it and start again");
  }
  InstallInterruptHandlers();  // two sigaction queries (~0.5 us); Python may have replaced ours since
  try {
    return body();
  } catch (const Interrupted& e) {
    s.interruptedBy = e.signal;
    s.watching = s.watchAll = s.watchHit = s.stopWhenIdle = s.stopWhenQuiet = false;
    s.watched.clear();
    return cut;
  }
}

int PhantoraNetwork::InterruptedBy() const { return Need().interruptedBy; }

void PhantoraNetwork::RunUntil(int64_t ns) {
  Interruptible(0, [&] {
    RunTo(ns);
    return 0;
  });
}

void PhantoraNetwork::RunTo(int64_t ns, bool untilIdle) {
  const int64_t now = Now();
  if (ns < now) {
    throw std::invalid_argument("RunUntil(" + std::to_string(ns) + "): the network is already at " +
                                std::to_string(now) + " ns");
  }
  Impl& s = Need();
  // untilIdle: a completion that leaves no flow in flight stops the run right after its event (Complete's
  // Simulator::Stop), where RunUntilIdle stops a drain; the stop queued for the step's end is then cancelled.
  const bool idleStops = untilIdle && s.inFlight > 0;
  s.stopWhenIdle = idleStops;
  EventId stop = Simulator::Stop(NanoSeconds(ns - now));
  RunSimulator();
  // Events stamped exactly `ns` but scheduled after the stop event: run them too. Each round runs at least one
  // event besides its stop, or the loop would queue stops for ever: then it fails naming the run call.
  while (!(idleStops && s.inFlight == 0) && NextEventTime() == ns) {
    const uint64_t before = Simulator::GetEventCount();
    stop = StopAtStepEnd(ns);
    RunSimulator();
    if (idleStops && s.inFlight == 0) {
      break;  // a completion left the fabric idle and stopped the run; its one event is not a spinning stop
    }
    if (Simulator::GetEventCount() == before + 1 && NextEventTime() == ns) {
      s.stopWhenIdle = false;
      throw std::logic_error("RunUntil(" + std::to_string(ns) +
                             "): an event of that ns orders after every stop, so the run call cannot finish it");
    }
  }
  s.stopWhenIdle = false;
  if (idleStops && s.inFlight == 0) {
    Simulator::Cancel(stop);
  }
}

bool PhantoraNetwork::RunUntilWatched(int64_t ns, const std::vector<uint64_t>& watch) {
  NS_LOG_FUNCTION(this << ns << watch.size());
  Impl& s = Need();
  s.watched.clear();
  s.watched.insert(watch.begin(), watch.end());
  return Interruptible(false, [&] { return RunWatching(ns, false, "RunUntilWatched"); });
}

bool PhantoraNetwork::RunUntilCompletion(int64_t ns) {
  NS_LOG_FUNCTION(this << ns);
  Need().watched.clear();
  return Interruptible(false, [&] { return RunWatching(ns, true, "RunUntilCompletion"); });
}

bool PhantoraNetwork::RunWatching(int64_t ns, bool all, const char* caller) {
  Impl& s = Need();
  const int64_t now = Now();
  const bool bounded = ns >= 0;
  if (bounded && ns < now) {
    s.watched.clear();
    throw std::invalid_argument(std::string(caller) + "(" + std::to_string(ns) + "): the network is already at " +
                                std::to_string(now) + " ns");
  }
  if (!bounded && s.inFlight == 0) {
    s.watched.clear();
    return false;
  }
  s.watchAll = all;
  s.watchHit = false;
  s.watching = all || !s.watched.empty();
  s.stopWhenIdle = !bounded;
  EventId stop;
  if (bounded) {
    stop = Simulator::Stop(NanoSeconds(ns - now));
  }
  RunSimulator();
  s.watching = false;
  s.watchAll = false;
  s.stopWhenIdle = false;
  s.watched.clear();
  // The rest of the ns it stopped in is run (below), but never past a completion that leaves no flow in flight:
  // a drain (RunUntilIdle) ends right after that event, so a run stepped by watched calls, or in chunks of any
  // size, ends there too; the ACKs and PFC frames of that ns still to come run in the next call, if any.
  if (bounded && !s.watchHit) {
    // Reached the limit: the events stamped `ns` but scheduled after the stop event, as RunUntil.
    RunTo(ns, true);
    return false;
  }
  // Stopped inside an ns (a watched completion, or idle): cancel the limit and finish that ns, unless the
  // completion it stopped at left the fabric idle.
  if (bounded) {
    Simulator::Cancel(stop);
  }
  if (s.inFlight > 0) {
    RunTo(Now(), true);
  }
  NS_LOG_LOGIC("stopped at " << Now() << " ns, watched completion: " << s.watchHit);
  return s.watchHit;
}

bool PhantoraNetwork::RunUntilIdle(int64_t limitNs) {
  return Interruptible(false, [&] {
    Impl& s = Need();
    return RunFlagged(limitNs, s.stopWhenIdle, [&] { return s.inFlight == 0; }, "RunUntilIdle");
  });
}

bool PhantoraNetwork::RunUntilQuiet(int64_t limitNs) {
  return Interruptible(false, [&] {
    Impl& s = Need();
    return RunFlagged(limitNs, s.stopWhenQuiet, [&] { return s.flows.empty(); }, "RunUntilQuiet");
  });
}

}  // namespace ns3
