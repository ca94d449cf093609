// FabricRecorder: turns the trace sources of a phantora fabric into the records PhantoraNetwork drains.
#ifndef PHANTORA_FABRIC_RECORDER_H
#define PHANTORA_FABRIC_RECORDER_H

#include "phantora-fabric.h"
#include "phantora-keyed-scheduler.h"
#include "phantora-network.h"

#include "ns3/abort.h"
#include "ns3/callback.h"
#include "ns3/event-id.h"
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
  /// the first instant fromNs + k x QueueSampleInterval at or after now (the barrier follows the one-ns window of
  /// fromNs, so that is fromNs: every event of it ran here and nothing more can arrive in it). No-op if this
  /// recorder's period began already, or it does not sample.
  void JoinSampling(int64_t fromNs, Callback<bool> busy);
  /// The ns this sampling period began at here (a flow start, or JoinSampling's), -1 if none is on.
  int64_t SamplingFrom() const { return m_from; }
  /// A partition worker at a barrier (`fromNs` or `idleNs` -1: no period known, or some worker has flows: nothing
  /// ends): the period from `fromNs` ends at its first instant at or after `idleNs`,
  /// where the last flow of every worker left (one engine's sampler finds none there and stops). If every worker
  /// ran that instant (it is before `ranBefore`, the barrier's next time): this worker's samples after it (made
  /// while another worker's flows looked busy) are dropped and their queue states restored, its next sample
  /// after it is cancelled, and the period is forgotten, so the next flow start begins a new one at its own
  /// phase, as in one engine; true. False if that instant is still to run. Then, either way, the samples so far
  /// are final (only those of the next window can be dropped at the next barrier).
  bool EndPeriod(int64_t fromNs, int64_t idleNs, int64_t ranBefore);

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
  EventId m_next;                ///< the next sample
  int64_t m_nextNs = -1;         ///< ... its ns (-1: none)
  /// A partition worker's samples since the last barrier (EndPeriod may drop them): per sample its ns and the
  /// rows it made, and each queue state it changed (its slot in m_lastSample and the value before).
  struct Undo {
    int64_t ns;
    std::size_t slot;
    uint64_t before;
  };
  std::vector<std::pair<int64_t, std::size_t>> m_made;
  std::vector<Undo> m_undo;
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
