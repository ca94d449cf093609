// FabricRecorder: turns the trace sources of a phantora fabric into the records PhantoraNetwork drains.
#ifndef PHANTORA_FABRIC_RECORDER_H
#define PHANTORA_FABRIC_RECORDER_H

#include "phantora-fabric.h"
#include "phantora-keyed-scheduler.h"
#include "phantora-network.h"

#include "ns3/abort.h"
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
  /// A partition worker's sampler (issue 38): sample only the switches `owned` marks (by node), and order this
  /// worker's samples of one ns after every other event and after workers `slot` - 1 .. 0 (lockstep rounds).
  void SampleOwned(std::vector<uint8_t> owned, uint32_t slot) {
    NS_ABORT_MSG_IF(slot >= PhantoraOrderKey::kSampleSlots,
                    "queue sampling: worker group " << slot << " has no sample key (at most "
                                                    << PhantoraOrderKey::kSampleSlots << " groups)");
    m_owned = std::move(owned);
    m_slot = slot;
  }
  /// A partition worker that learnt at a barrier that sampling began at `fromNs` in another worker: sample from
  /// the first instant fromNs + k x QueueSampleInterval after now (its queues were empty until then). No-op if
  /// this recorder started (or stopped) sampling already, or does not sample.
  void JoinSampling(int64_t fromNs, Callback<bool> busy);
  /// The ns sampling began at here (the first flow start, or JoinSampling's), -1 if it has not.
  int64_t SamplingFrom() const { return m_from; }

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
  /// Queue the next sample at ns `ts`: in the keyed mode with the order key SampleKey(ts, slot),
  /// after every other event of its ns (it reads each queue as that ns leaves it, in one engine and in every
  /// partition worker alike); otherwise as ns-3 schedules it (`delay` from now, the running event's context).
  void ScheduleSample(uint64_t ts);

  Ptr<PhantoraFabric> m_fabric;
  std::vector<uint8_t> m_owned;  ///< a partition worker: the nodes it samples (empty: every switch)
  uint32_t m_slot = 0;           ///< a partition worker's group (its samples' key: SampleKey)
  int64_t m_from = -1;           ///< SamplingFrom()
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
