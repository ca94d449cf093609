// FabricRecorder: trace sinks and queue sampling.
#include "fabric-recorder.h"
#include "phantora-simulator-impl.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/log.h"
#include "ns3/make-event.h"
#include "ns3/simulator.h"

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
  const int64_t k = now < fromNs ? 0 : (now - fromNs) / every + 1;  // the first instant after now
  m_busy = busy;
  m_sampling = true;
  m_from = fromNs;
  ScheduleSample(static_cast<uint64_t>(fromNs + k * every));
}

void FabricRecorder::ScheduleSample(uint64_t ts) {
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  if (sim && sim->Keyed()) {
    sim->ScheduleKeyedAt(ts, Simulator::NO_CONTEXT, SampleKey(ts, m_slot), MakeEvent(&FabricRecorder::Sample, this));
    return;
  }
  Simulator::Schedule(NanoSeconds(static_cast<int64_t>(ts) - NowNs()), &FabricRecorder::Sample, this);
}

void FabricRecorder::Sample() {
  const int64_t now = NowNs();
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
        m_lastSample[k] = b;
      }
    }
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
