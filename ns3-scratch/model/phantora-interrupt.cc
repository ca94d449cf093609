// The SIGTERM / SIGINT note that stops a long simulator run (see phantora-interrupt.h).
#include "phantora-interrupt.h"

#include <csignal>

namespace ns3 {

std::atomic<int> g_phantoraInterrupt{0};

namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
struct sigaction g_previous[NSIG];  // the handler each of ours chains to

void OnSignal(int sig, siginfo_t* info, void* context) {
  g_phantoraInterrupt.store(sig, std::memory_order_relaxed);
  const struct sigaction& prev = g_previous[sig];
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
}

}  // namespace

void InstallInterruptHandlers() {
  for (int sig : kSignals) {
    struct sigaction cur{};
    if (sigaction(sig, nullptr, &cur) != 0) {
      continue;
    }
    const bool isFunction = (cur.sa_flags & SA_SIGINFO) || (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN);
    if (!isFunction || ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == &OnSignal)) {
      continue;  // default (the process ends anyway), ignored, or ours already
    }
    g_previous[sig] = cur;  // ours is not installed now, so no handler reads this while it changes
    struct sigaction ours = cur;
    ours.sa_flags = (cur.sa_flags & ~SA_RESETHAND) | SA_SIGINFO;
    ours.sa_sigaction = &OnSignal;
    sigaction(sig, &ours, nullptr);
  }
}

int TakeInterrupt() { return g_phantoraInterrupt.exchange(0, std::memory_order_relaxed); }

}  // namespace ns3
