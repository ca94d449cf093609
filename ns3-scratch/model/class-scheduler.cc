// Class scheduling of an egress port: round robin (the default), strict priority, deficit round robin.
#include "class-scheduler.h"

#include <sstream>
#include <stdexcept>

namespace ns3 {

ClassSched ParseClassSched(const std::string& text) {
  if (text == "rr") {
    return ClassSched::RoundRobin;
  }
  if (text == "strict") {
    return ClassSched::Strict;
  }
  if (text == "wrr") {
    return ClassSched::Weighted;
  }
  throw std::invalid_argument("switch attribute ClassScheduling: expected rr, strict or wrr, got '" + text + "'");
}

std::array<uint32_t, kNumPrio> ParseClassWeights(const std::string& text) {
  std::array<uint32_t, kNumPrio> w{};
  w.fill(1);
  std::string spaced = text;
  for (char& ch : spaced) {
    if (ch == ',') {
      ch = ' ';
    }
  }
  std::istringstream in(spaced);
  std::string word;
  uint32_t c = 1;
  while (in >> word) {
    std::size_t used = 0;
    unsigned long v = 0;
    try {
      v = word[0] == '-' ? 0 : std::stoul(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 1 || v > 1'000'000 || c >= kNumPrio) {
      throw std::invalid_argument("switch attribute ClassWeights: expected 7 integers >= 1 (classes 1..7), got '" +
                                  text + "'");
    }
    w[c++] = static_cast<uint32_t>(v);
  }
  if (c != 1 && c != kNumPrio) {
    throw std::invalid_argument("switch attribute ClassWeights: expected 7 weights (classes 1..7), got '" + text + "'");
  }
  return w;
}

int PickClass(ClassSched kind, const std::array<uint32_t, kNumPrio>& weights, uint64_t quantumBytes,
              const std::array<RingQueue<TxItem>, kNumPrio>& queues, uint32_t nonEmpty, const bool* paused,
              ClassSchedState& st) {
  constexpr uint32_t kData = kNumPrio - 1;
  auto has = [nonEmpty](uint32_t c) { return ((nonEmpty >> c) & 1U) != 0; };
  auto ready = [&](uint32_t c) { return has(c) && !paused[c]; };
  if (kind != ClassSched::Weighted) {
    // Bit c: class c is ready. Strict takes the lowest; round robin the first from `rr` on, cyclically
    // over 1..7 (then the turn passes to the class after it).
    uint32_t mask = 0;
    for (uint32_t c = 1; c < kNumPrio; ++c) {
      mask |= static_cast<uint32_t>(ready(c)) << c;
    }
    if (mask == 0) {
      return -1;
    }
    if (kind == ClassSched::Strict) {
      return __builtin_ctz(mask);
    }
    const uint32_t from = mask & (~0u << st.rr);  // st.rr is in 1..7
    const uint32_t c = static_cast<uint32_t>(__builtin_ctz(from ? from : mask));
    st.rr = c % kData + 1;
    return static_cast<int>(c);
  }
  // Deficit round robin: class `rr` keeps the turn while its credit covers its head packet; an empty class
  // loses its credit; a paused one keeps it and is skipped.
  bool any = false;
  for (uint32_t c = 1; c < kNumPrio; ++c) {
    any = any || ready(c);
    if (!has(c)) {
      st.deficit[c] = 0;
    }
  }
  if (!any) {
    return -1;
  }
  for (;;) {
    const uint32_t c = st.rr;
    if (ready(c)) {
      if (st.fresh) {
        st.deficit[c] += weights[c] * quantumBytes;
        st.fresh = false;
      }
      if (st.deficit[c] >= queues[c].front().wireBytes) {
        st.deficit[c] -= queues[c].front().wireBytes;
        return static_cast<int>(c);
      }
    }
    st.rr = st.rr % kData + 1;
    st.fresh = true;
  }
}

}  // namespace ns3
