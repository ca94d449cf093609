// Records mode of phantora-ns3-runner (`--records`): after the script, run the network the way `phantora netsim`
// drives it in-process and print every record it reads, one per line, so netsim needs no Python bindings.
#ifndef PHANTORA_RUNNER_RECORDS_H
#define PHANTORA_RUNNER_RECORDS_H

#include "phantora-network.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace phantora_runner {

/// Run until every flow is acknowledged, as netsim does in-process, printing the records to `out`, what the fabric
/// runs by (A) first, before the run, so netsim can warn of its settings at once:
///   C ID START END SIZE SRC DST [OFFSET BYTES]...   a completion at the receiver, with its lost ranges (DLCP)
///   T NOW EVENTS                                     after each run call (a progress tick)
///   U IN_FLIGHT NOW                                  the network cannot drain (then nothing more, exit 3)
///   F SRC DST SPORT DPORT SIZE START FCT STANDALONE ID   P TIME NODE TYPE PORT PRIO PAUSE FROM
///   Q TIME NODE PORT PRIO BYTES   D TIME NODE PORT PRIO FLOW SEQ   R TIME NODE PORT PRIO FLOW SEQ PAYLOAD
///   N TIME NODE FLOW FROM SEQ     E TIME NODE PORT PRIO CHANNEL FLOW
///   X ID RETX_PACKETS RETX_BYTES OOO_PACKETS REORDER_MAX_BYTES
///   L CHANNEL SRC DST BPS TX_BYTES TX_PACKETS PAUSED_NS ECN_MARKS MAX_QUEUE_BYTES
///   S KEY VALUE (the Stats(), values with full double precision)
///   A KEY TEXT (EffectiveParams(): TEXT is the rest of the line; these come first)   Z QUIET NOW (the last line)
/// `watch`: flows to stop at (netsim's progress display, `drain_observed`), each removed once it completed;
/// empty: one RunUntilIdle. Returns the exit code: 0, or 3 when the flows cannot drain.
int RunRecords(ns3::PhantoraNetwork& net, std::vector<uint64_t> watch, std::FILE* out);

/// The flow ids of a `--watch` argument: comma-separated non-negative integers (throws otherwise).
std::vector<uint64_t> ParseWatch(const std::string& text);

}  // namespace phantora_runner

#endif  // PHANTORA_RUNNER_RECORDS_H
