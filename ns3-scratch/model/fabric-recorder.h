// FabricRecorder: turns the trace sources of a phantora fabric into the records PhantoraNetwork drains.
#ifndef PHANTORA_FABRIC_RECORDER_H
#define PHANTORA_FABRIC_RECORDER_H

#include "phantora-fabric.h"
#include "phantora-network.h"

#include "ns3/callback.h"
#include "ns3/nstime.h"
#include "ns3/object.h"

#include <utility>
#include <vector>

namespace ns3 {

/// The order key of the event running now (keyed mode with PhantoraSimulatorImpl::KeepRunningKey).
RecordKey RunningRecordKey();

/**
 * Connects to the "PfcRx" trace of every port, "Drop" and "EcnMark" of every switch and "CnpRx" of
 * every NIC, and samples switch queues while flows run. A trace that is not wanted is not
 * connected, so it costs nothing per event. Attributes: TraceDrops, TraceCnp, TraceEcn,
 * QueueSampleInterval.
 */
class FabricRecorder : public Object {
 public:
  static TypeId GetTypeId();

  /// Connect to the traces of every node of `fabric` (its NICs and switches installed).
  void Connect(Ptr<PhantoraFabric> fabric);
  /// Start sampling switch queues every QueueSampleInterval (if > 0 and not already sampling);
  /// sampling stops at the first sample at which `busy()` is false.
  void StartSampling(Callback<bool> busy);
  /// QueueSampleInterval > 0: StartSampling samples.
  bool SamplesQueues() const { return m_sampleInterval.IsStrictlyPositive(); }

  std::vector<PfcRecord> pfcs;
  std::vector<QueueSample> samples;
  std::vector<DropRecord> drops;
  std::vector<TrimRecord> trims;
  std::vector<CnpRecord> cnps;
  std::vector<EcnRecord> ecnMarks;
  /// The order key of the event that made each record above (RecordKey), kept only with `keepKeys` (a partition
  /// worker: PhantoraNetwork::DrainRecordKeys). Queue samples have none (a worker does not sample).
  bool keepKeys = false;
  std::vector<RecordKey> pfcKeys, dropKeys, trimKeys, cnpKeys, ecnKeys;
  /// Keep the running event's key in `keys` if keepKeys.
  void Keep(std::vector<RecordKey>& keys) const {
    if (keepKeys) {
      keys.push_back(RunningRecordKey());
    }
  }

 protected:
  void DoDispose() override;

 private:
  void Sample();

  Ptr<PhantoraFabric> m_fabric;
  Callback<bool> m_busy;
  bool m_sampling = false;
  std::vector<uint64_t> m_lastSample;
  // Attributes.
  bool m_traceDrops = true;
  bool m_traceCnp = true;
  bool m_traceEcn = true;
  Time m_sampleInterval;
};

/// Move a record vector out, leaving it empty.
template <typename T>
std::vector<T> TakeAll(std::vector<T>& records) {
  std::vector<T> out;
  out.swap(records);
  return out;
}

}  // namespace ns3

#endif  // PHANTORA_FABRIC_RECORDER_H
