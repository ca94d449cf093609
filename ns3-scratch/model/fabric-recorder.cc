// FabricRecorder: trace sinks and queue sampling.
#include "fabric-recorder.h"
#include "phantora-simulator-impl.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/log.h"
#include "ns3/make-event.h"
#include "ns3/simulator.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraFabricRecorder");
NS_OBJECT_ENSURE_REGISTERED(FabricRecorder);

namespace {

int64_t NowNs() { return Simulator::Now().GetNanoSeconds(); }

}  // namespace

RecordKey RunningRecordKey() {
  const PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  const PhantoraOrderKey key = sim->RunningKey();
  return RecordKey{static_cast<int64_t>(sim->NowStep()), key.schedTs, key.node, key.count};
}

TypeId FabricRecorder::GetTypeId() {
  static TypeId tid = PhantoraTypeId<FabricRecorder, Object>("ns3::FabricRecorder")
          .AddAttribute("TraceDrops", "Record every packet dropped at a switch ingress", BooleanValue(true),
                        MakeBooleanAccessor(&FabricRecorder::m_traceDrops), MakeBooleanChecker())
          .AddAttribute("TraceCnp", "Record every CNP received by a sender (off: counted only)", BooleanValue(true),
                        MakeBooleanAccessor(&FabricRecorder::m_traceCnp), MakeBooleanChecker())
          .AddAttribute("TraceEcn", "Record every CE mark made by a switch (off: counted only)", BooleanValue(true),
                        MakeBooleanAccessor(&FabricRecorder::m_traceEcn), MakeBooleanChecker())
          .AddAttribute("QueueSampleInterval", "Sample switch queues this often while flows run; 0 = off",
                        TimeValue(Time(0)), MakeTimeAccessor(&FabricRecorder::m_sampleInterval),
                        MakeTimeChecker(Time(0)));
  return tid;
}

void FabricRecorder::Connect(Ptr<PhantoraFabric> fabric) {
  m_fabric = fabric;
  for (uint32_t n = 0; n < fabric->NumNodes(); ++n) {
    const PhantoraFabric::NodeInfo& info = fabric->GetNode(n);
    if (info.nic && m_traceCnp) {
      info.nic->TraceConnectWithoutContext(
          "CnpRx", Callback<void, uint64_t, uint32_t, uint64_t>([this, n](uint64_t flow, uint32_t from, uint64_t seq) {
            cnps.push_back(CnpRecord{NowNs(), n, from, flow, seq});
            Keep(cnpKeys);
          }));
    }
    if (info.sw && m_traceDrops) {
      info.sw->TraceConnectWithoutContext(
          "Drop", Callback<void, uint32_t, uint32_t, uint64_t, uint64_t>(
                      [this, n](uint32_t port, uint32_t cls, uint64_t flow, uint64_t seq) {
                        drops.push_back(DropRecord{NowNs(), n, port, cls, flow, seq});
                        Keep(dropKeys);
                      }));
      info.sw->TraceConnectWithoutContext(
          "Trim", Callback<void, uint32_t, uint32_t, uint64_t, uint64_t, uint32_t>(
                      [this, n](uint32_t port, uint32_t cls, uint64_t flow, uint64_t seq, uint32_t payload) {
                        trims.push_back(TrimRecord{NowNs(), n, port, cls, flow, seq, payload});
                        Keep(trimKeys);
                      }));
    }
    if (info.sw && m_traceEcn) {
      const std::vector<uint32_t>* channels = &info.portChannel;
      info.sw->TraceConnectWithoutContext(
          "EcnMark",
          Callback<void, uint32_t, uint32_t, uint64_t>([this, n, channels](uint32_t port, uint32_t cls, uint64_t flow) {
            ecnMarks.push_back(EcnRecord{NowNs(), n, port, cls, (*channels)[port], flow});
            Keep(ecnKeys);
          }));
    }
    const uint32_t type = IsEndpoint(info.kind) ? 0 : (info.kind == NodeKind::Switch ? 1 : 2);
    for (uint32_t p = 0; p < info.ports.size(); ++p) {
      const uint32_t peer = fabric->GetRoutes()->Neighbours(n)[p].peer;
      info.ports[p]->TraceConnectWithoutContext(
          "PfcRx",
          Callback<void, uint32_t, uint32_t, bool>([this, n, type, peer](uint32_t port, uint32_t cls, bool pause) {
            pfcs.push_back(PfcRecord{NowNs(), n, type, port, cls, pause ? 1u : 0u, peer});
            Keep(pfcKeys);
          }));
    }
  }
}

void FabricRecorder::StartSampling(Callback<bool> busy) {
  if (m_sampling || !m_sampleInterval.IsStrictlyPositive()) {
    return;
  }
  m_busy = busy;
  m_sampling = true;
  m_from = NowNs();
  ScheduleSample(static_cast<uint64_t>(m_from));
}

void FabricRecorder::JoinSampling(int64_t fromNs, Callback<bool> busy) {
  if (m_from >= 0 || !m_sampleInterval.IsStrictlyPositive()) {
    return;
  }
  const int64_t every = m_sampleInterval.GetNanoSeconds();
  const int64_t now = NowNs();
  const int64_t k = now <= fromNs ? 0 : (now - fromNs + every - 1) / every;  // the first instant at or after now
  m_busy = busy;
  m_sampling = true;
  m_from = fromNs;
  ScheduleSample(static_cast<uint64_t>(fromNs + k * every));
}

bool FabricRecorder::EndPeriod(int64_t fromNs, int64_t idleNs, int64_t ranBefore) {
  const int64_t every = m_sampleInterval.GetNanoSeconds();
  const int64_t end = idleNs <= fromNs ? fromNs : fromNs + (idleNs - fromNs + every - 1) / std::max<int64_t>(every, 1) * every;
  const bool over = fromNs >= 0 && idleNs >= 0 && every > 0 && end < ranBefore;
  if (over) {
    std::size_t rows = 0;
    while (!m_made.empty() && m_made.back().first > end) {
      rows += m_made.back().second;
      m_made.pop_back();
    }
    NS_ABORT_MSG_IF(rows > samples.size() ||
                        std::any_of(samples.end() - static_cast<std::ptrdiff_t>(rows), samples.end(),
                                    [end](const QueueSample& q) { return q.timeNs <= end; }),
                    "queue sampling: " << rows << " rows after the period's end at " << end
                                       << " ns were drained before the barrier that ends it");
    samples.resize(samples.size() - rows);
    for (; !m_undo.empty() && m_undo.back().ns > end; m_undo.pop_back()) {
      m_lastSample[m_undo.back().slot] = m_undo.back().before;
    }
    NS_LOG_LOGIC("sampling period from " << fromNs << " ends at " << end << " ns: " << rows << " rows dropped");
    if (m_nextNs > end) {  // (one at or before it is a joiner's first: it finds no flow there and stops)
      Simulator::Cancel(m_next);
      m_nextNs = -1;
      m_sampling = false;
    }
    m_from = -1;
  }
  m_made.clear();
  m_undo.clear();
  return over;
}

void FabricRecorder::ScheduleSample(uint64_t ts) {
  m_nextNs = static_cast<int64_t>(ts);
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  if (sim && sim->Keyed()) {
    m_next = sim->ScheduleKeyedAt(ts, Simulator::NO_CONTEXT, SampleKey(ts, m_slot),
                                  MakeEvent(&FabricRecorder::Sample, this));
    return;
  }
  m_next = Simulator::Schedule(NanoSeconds(static_cast<int64_t>(ts) - NowNs()), &FabricRecorder::Sample, this);
}

void FabricRecorder::Sample() {
  const int64_t now = NowNs();
  m_nextNs = -1;
  const bool undo = !m_owned.empty();  // a partition worker: EndPeriod may drop this sample
  const std::size_t rows0 = samples.size();
  std::size_t k = 0;
  for (uint32_t n = 0; n < m_fabric->NumNodes(); ++n) {
    const Ptr<PfcSwitch>& sw = m_fabric->GetNode(n).sw;
    if (!sw) {
      continue;
    }
    if (!m_owned.empty() && !m_owned[n]) {  // another partition worker's switch: its slots stay zero here
      k += static_cast<std::size_t>(sw->NumPorts()) * kNumPrio;
      continue;
    }
    for (uint32_t p = 0; p < sw->NumPorts(); ++p) {
      for (uint32_t c = 0; c < kNumPrio; ++c, ++k) {
        if (k >= m_lastSample.size()) {
          m_lastSample.resize(k + 1, 0);
        }
        const uint64_t b = sw->QueueBytes(p, c);
        if (b || m_lastSample[k]) {
          samples.push_back(QueueSample{now, n, p, c, b});
        }
        if (undo && b != m_lastSample[k]) {
          m_undo.push_back(Undo{now, k, m_lastSample[k]});
        }
        m_lastSample[k] = b;
      }
    }
  }
  if (undo) {
    m_made.emplace_back(now, samples.size() - rows0);
  }
  if (!m_busy()) {
    m_sampling = false;
    return;
  }
  ScheduleSample(static_cast<uint64_t>(now + m_sampleInterval.GetNanoSeconds()));
}

void FabricRecorder::DoDispose() {
  m_fabric = nullptr;
  m_busy.Nullify();
  Object::DoDispose();
}

}  // namespace ns3
