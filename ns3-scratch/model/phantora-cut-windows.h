// PhantoraCutWindows: a partition worker's window loop in C++, exchanging over local Unix stream sockets.
//
// The same loop as phantora.netsim.cut_windows.run_windows (its docstring gives the window rules: lookahead,
// earliest output, release bounds, lockstep rounds, queue sampling, reacting flows), run without a Python call per
// window: bridge.cut_unix opens the sockets and checks the hellos, then hands their descriptors over. Each barrier
// report is one bridge.cut_frame frame (PhantoraCutPeers: a length, then a msgpack array), every receive bounded by
// a timeout, a closed peer named.
// Only standard types cross this interface (cppyy loads it beside phantora-network.h).
#ifndef PHANTORA_CUT_WINDOWS_H
#define PHANTORA_CUT_WINDOWS_H

#include "phantora-network.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ns3 {

/// What one worker says at a barrier (phantora.netsim.cut_windows.PeerReport); NEVER (INT64_MAX) for none.
struct CutReport {
  int64_t next = INT64_MAX;        ///< its next event before this barrier's deliveries
  int64_t minArrival = INT64_MAX;  ///< least arrival of the messages it sent in the window
  int64_t later = INT64_MAX;       ///< least ns a release it causes lands at, after its dependency's completion ns
  int64_t same = INT64_MAX;        ///< ... in that ns
  int64_t sampleFrom = INT64_MAX;  ///< queue sampling: the ns its sampling began at
  int64_t reactBound = INT64_MAX;  ///< stepped workers: reacting flows' bound
  int64_t reactStop = INT64_MAX;   ///< ... and stop
  int64_t output = 0;              ///< its earliest output (0: not told)
  int64_t idle = INT64_MAX;        ///< queue sampling: the ns its last flow left (NEVER while it has flows)
  int64_t left = 0;                ///< a run to the last completion: the flows it completes still in flight
  int64_t finish = -1;             ///< ... a lower bound on the last completion's ns (-1: none)
  uint32_t keyLen = 0;             ///< a lockstep round's next-event key: 0 or 4 ints
  int64_t key[4] = {0, 0, 0, 0};
  std::string batch;  ///< its cut-cable messages for the receiver (PhantoraNetwork::CutDeliver's bytes)
  /// PhantoraCutPeers::ExchangeViews: `batch` left empty, its bytes in the peers' read buffer instead (valid until
  /// the next exchange)
  const uint8_t* view = nullptr;
  std::size_t viewLen = 0;
};

/// One worker's connected stream sockets to the other workers of its partition on one machine. A frame is
/// bridge.cut_frame's (the body's length as a little-endian u64, then the msgpack array [seq, next, arr, release
/// later, release same, sample from, react bound, react stop, output, idle, left, finish, key, batch]), so either
/// loop reads the
/// other's. The descriptors stay the caller's (bridge.cut_unix closes them).
class PhantoraCutPeers {
 public:
  /// `fds[g]`: the socket to worker g, -1 at this worker's own group; a barrier waits at most `timeoutMs` of
  /// silence (`firstTimeoutMs` at barrier 0, which follows every worker's set-up), then throws naming the workers.
  PhantoraCutPeers(uint32_t group, const std::vector<int>& fds, int64_t timeoutMs, int64_t firstTimeoutMs);
  uint32_t Group() const { return m_group; }
  uint32_t Groups() const { return static_cast<uint32_t>(m_fds.size()); }
  /// Send every peer its report (`mine` with `batches[g]`), then read each peer's report of barrier `seq` into
  /// `out[g]` (frames of the next barrier may follow and stay buffered); throws naming a silent or closed worker.
  void Exchange(uint64_t seq, const CutReport& mine, const std::vector<std::string>& batches,
                std::vector<CutReport>& out);
  /// The same with byte buffers (PhantoraCutRunWindows' outboxes, swapped in without a copy).
  void Exchange(uint64_t seq, const CutReport& mine, const std::vector<std::vector<uint8_t>>& batches,
                std::vector<CutReport>& out);
  /// The same, each report's batch left where it was read (CutReport::view, valid until the next exchange): the
  /// window loop's, which delivers each batch before its next exchange, with no copy of the bytes.
  /// `batches[g]`: the (data, size) of worker g's.
  void ExchangeViews(uint64_t seq, const CutReport& mine,
                     const std::vector<std::pair<const char*, std::size_t>>& batches, std::vector<CutReport>& out);
  /// Bytes read from peers and not yet taken as reports (0 between runs unless a peer ran ahead).
  uint64_t Buffered() const;
  /// A progress display's beats (issue 38): after a window, once `everyCpuNs` of the process's CPU passed since
  /// the last, PhantoraCutRunWindows writes `fd` one msgpack array [ns-3's clock ns, its events, the CPU ns of the
  /// call so far] (28 bytes, one write: all of it or, on a full pipe, none). `fd` < 0: none (the default).
  void SetBeat(int fd, int64_t everyCpuNs);
  int BeatFd() const { return m_beatFd; }
  int64_t BeatEveryNs() const { return m_beatEveryNs; }

  static constexpr uint64_t kMaxBatch = uint64_t{1} << 30;  ///< the most a frame's batch may announce

 private:
  /// Exchange() of the batches at (data, size).
  void ExchangeBytes(uint64_t seq, const CutReport& mine,
                     const std::vector<std::pair<const char*, std::size_t>>& batches, std::vector<CutReport>& out,
                     bool views = false);
  /// The frame of barrier `seq` from worker g into `out` if it is all read; with `view`, its batch stays where it
  /// is (m_keep holds the frame, m_viewAt its batch's offset in it).
  bool Take(uint32_t g, uint64_t seq, CutReport& out, bool view);
  bool Read(uint32_t g);  ///< false once the peer closed its end
  std::string Closed(uint32_t g) const;

  uint32_t m_group;
  std::vector<int> m_fds;
  int64_t m_timeoutMs;
  int64_t m_firstTimeoutMs;
  std::vector<std::vector<uint8_t>> m_bufs;  ///< bytes read per peer: the first m_len (the rest: room to read into)
  std::vector<std::size_t> m_len;
  std::vector<std::size_t> m_at;      ///< where each buffer's first frame not taken starts
  std::vector<std::size_t> m_keep;    ///< a frame taken as a view in this exchange: kept from here on (else none)
  std::vector<std::size_t> m_viewAt;  ///< ... and its batch's offset in that frame
  int m_beatFd = -1;                  ///< SetBeat's
  int64_t m_beatEveryNs = 0;
};

/// A partition worker's part of one engine's RunUntil over windows (phantora.netsim.cut_windows.run_windows):
/// args = {group, lookahead ns, until ns (-1: run until nothing is left anywhere), sampling (0/1), reacting (0/1),
/// first seq (the barriers already made), finish (0/1: with until -1, stop after the ns of the last completion)}.
/// Returns {stopped ns (-1: ran to until), barriers made, windows, message bytes out, lockstep rounds, CPU ns in the runs, wall ns in the exchanges, then the windows by what ended them
/// (kCutWhy order), then by width (kCutWidths buckets: 0, 1, 2-9, 10-99, ...)}. `peers` null or `args` empty: a
/// warm-up call (nothing run, an empty result; with a worker's own `peers`, cppyy's first call of it too).
std::vector<int64_t> PhantoraCutRunWindows(PhantoraNetwork& net, PhantoraCutPeers* peers,
                                           const std::vector<int64_t>& args);

/// An exchange's own cost (bench/bench_cut_exchange.py, bench/bench_partition.py's model): `rounds` barriers from
/// `firstSeq` on, each sending every peer the same report and a batch of `batchBytes` zero bytes and reading theirs,
/// as PhantoraCutRunWindows makes them but with no window between. Returns {CPU ns, wall ns} of the rounds.
std::vector<int64_t> PhantoraCutExchangeRounds(PhantoraCutPeers& peers, uint64_t firstSeq, uint64_t rounds,
                                               uint64_t batchBytes);

/// What ended a window, in the order of PhantoraCutRunWindows' counts (phantora.netsim.cut_windows' names).
constexpr const char* kCutWhy[] = {"lookahead",     "release after",  "release in",     "lockstep",       "until",
                                   "earliest output", "reacting flow", "sampling start", "last completion"};
constexpr uint32_t kCutWhyCount = 9;
constexpr uint32_t kCutWidths = 21;  ///< width buckets: 0, 1, then 2-9 and one per decade up to 19 digits

}  // namespace ns3

#endif  // PHANTORA_CUT_WINDOWS_H
