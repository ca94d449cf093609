// Signals during a long simulator run: SIGTERM / SIGINT stop it after the current event.
//
// Python's signal handlers run only between bytecodes, so a minutes-long Simulator::Run() called through cppyy
// would ignore SIGTERM and Ctrl-C until it returned. InstallInterruptHandlers() puts a C-level handler in front
// of the process's own (Python's) for SIGTERM and SIGINT: it notes the signal and calls the previous handler,
// so Python still runs its handler once control is back. PhantoraScheduler checks the note on every event
// (a relaxed atomic load) and stops the simulator; the facade's run call then returns at once and
// PhantoraNetwork::InterruptedBy() names the signal. A note is taken by the run call it cut (or cleared by
// a new PhantoraNetwork).
#ifndef PHANTORA_INTERRUPT_H
#define PHANTORA_INTERRUPT_H

#include <atomic>

namespace ns3 {

/// The signal number that arrived and was not yet taken, or 0 (hidden: read without the GOT on every event).
extern std::atomic<int> g_phantoraInterrupt __attribute__((visibility("hidden")));

/// True once SIGTERM or SIGINT arrived (cheap: on every event).
inline bool InterruptPending() { return g_phantoraInterrupt.load(std::memory_order_relaxed) != 0; }

/// Put the noting handler in front of SIGTERM's and SIGINT's current handlers, where those are functions
/// (a signal left at its default or ignored is left alone). Idempotent; call before each run, since a
/// later handler (Python's signal.signal) replaces it.
void InstallInterruptHandlers();

/// The pending signal (0 if none), cleared.
int TakeInterrupt();

}  // namespace ns3

#endif  // PHANTORA_INTERRUPT_H
