// PhantoraCutWindows: a partition worker's window loop in C++ (see the header).
#include "phantora-cut-windows.h"

#include "phantora-interrupt.h"

#include "ns3/simulator.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace ns3 {

namespace {

constexpr int64_t kNever = INT64_MAX;
constexpr std::size_t kReadChunk = std::size_t{1} << 20;
constexpr uint64_t kMaxFrame = PhantoraCutPeers::kMaxBatch + 4096;  // bridge.cut_frame.MAX_FRAME
constexpr uint32_t kFields = 14;                                   // bridge.cut_frame.FIELDS
constexpr uint32_t kMaxKey = 8;                                    // bridge.cut_frame.MAX_KEY
constexpr std::size_t kNone = SIZE_MAX;                            // PhantoraCutPeers::m_keep: nothing kept

// A frame is bridge.cut_frame's: the body's length (little-endian u64), then one msgpack array
// [seq, next, arr, release later, release same, sample from, react bound, react stop, output, idle, left, finish,
// key, batch].
// Written with every int as msgpack's int 64 and the batch as bin 32; read in any of msgpack's int forms.

void PutBig(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

void PutInt(std::string& out, int64_t v) {
  out.push_back(static_cast<char>(0xd3));
  PutBig(out, static_cast<uint64_t>(v), 8);
}

/// Reads one msgpack body field by field; false on anything that is not the frame's shape.
class Unpacker {
 public:
  Unpacker(const uint8_t* p, std::size_t n) : m_p(p), m_end(p + n) {}
  bool Done() const { return m_p == m_end; }
  bool Big(int bytes, uint64_t& v) {
    if (m_end - m_p < bytes) {
      return false;
    }
    v = 0;
    for (int i = 0; i < bytes; ++i) {
      v = (v << 8) | *m_p++;
    }
    return true;
  }
  bool Byte(uint8_t& b) {
    if (m_p == m_end) {
      return false;
    }
    b = *m_p++;
    return true;
  }
  bool Array(uint32_t& n) {
    uint8_t t = 0;
    uint64_t v = 0;
    if (!Byte(t)) {
      return false;
    }
    if ((t & 0xf0) == 0x90) {
      n = t & 0x0f;
      return true;
    }
    if (t == 0xdc && Big(2, v)) {
      n = static_cast<uint32_t>(v);
      return true;
    }
    return false;
  }
  bool Int(int64_t& out) {
    uint8_t t = 0;
    uint64_t v = 0;
    if (!Byte(t)) {
      return false;
    }
    if (t <= 0x7f || t >= 0xe0) {
      out = static_cast<int8_t>(t);
      return true;
    }
    const int bytes = t == 0xcc || t == 0xd0 ? 1 : t == 0xcd || t == 0xd1 ? 2 : t == 0xce || t == 0xd2 ? 4
                      : t == 0xcf || t == 0xd3                             ? 8
                                                                           : 0;
    if (bytes == 0 || !Big(bytes, v)) {
      return false;
    }
    if (t >= 0xd0) {  // signed: sign-extend
      const int shift = 64 - 8 * bytes;
      out = static_cast<int64_t>(v << shift) >> shift;
    } else if (v > static_cast<uint64_t>(INT64_MAX)) {
      return false;  // no ns or seq of ours is that large
    } else {
      out = static_cast<int64_t>(v);
    }
    return true;
  }
  bool Bin(const uint8_t*& data, std::size_t& n) {
    uint8_t t = 0;
    uint64_t v = 0;
    if (!Byte(t)) {
      return false;
    }
    const int bytes = t == 0xc4 ? 1 : t == 0xc5 ? 2 : t == 0xc6 ? 4 : 0;
    if (bytes == 0 || !Big(bytes, v) || static_cast<uint64_t>(m_end - m_p) < v) {
      return false;
    }
    data = m_p;
    n = static_cast<std::size_t>(v);
    m_p += v;
    return true;
  }

 private:
  const uint8_t* m_p;
  const uint8_t* m_end;
};

int64_t CpuNs() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t OrNever(int64_t t) { return t < 0 ? kNever : t; }

/// PhantoraCutPeers::SetBeat's frame: msgpack [clock ns (int 64), events (uint 64), CPU ns (int 64)], one write.
void WriteBeat(int fd, int64_t now, uint64_t events, int64_t cpuNs) {
  uint8_t frame[28];
  frame[0] = 0x93;  // an array of 3
  auto put = [&frame](std::size_t at, uint8_t tag, uint64_t v) {
    frame[at] = tag;
    for (int i = 0; i < 8; ++i) {
      frame[at + 1 + i] = static_cast<uint8_t>(v >> (56 - 8 * i));  // big-endian
    }
  };
  put(1, 0xd3, static_cast<uint64_t>(now));
  put(10, 0xcf, events);
  put(19, 0xd3, static_cast<uint64_t>(cpuNs));
  const ssize_t k = write(fd, frame, sizeof frame);  // a pipe: up to PIPE_BUF bytes go whole or not at all
  (void)k;  // a full pipe (the reader is slow) or a closed one: this beat is dropped, the run goes on
}

std::string Worker(uint32_t g) { return "partition worker " + std::to_string(g); }

/// A signal (SIGTERM, SIGINT) cuts a window's run short (PhantoraScheduler stops at it): the loop must not go on as
/// if the window ran whole. Its note is left for PhantoraNetwork::InterruptedBy.
void StopIfInterrupted(uint32_t group) {
  if (InterruptPending()) [[unlikely]] {
    throw std::runtime_error(Worker(group) + ": interrupted by signal " +
                             std::to_string(g_phantoraInterrupt.load(std::memory_order_relaxed)) +
                             " (its windows stop here)");
  }
}

using Wide = __int128;  // window ends as phantora.netsim.cut_windows computes them (Python ints: no overflow)

enum How { kBefore, kThrough, kLockstep };
enum Why { kLookahead, kReleaseLater, kReleaseSame, kLockstepNs, kUntil, kOutput, kReact, kSamplingStart, kFinish };

/// cut_windows.window_end.
std::pair<Wide, How> WindowEnd(Wide glob, Wide la, Wide later, Wide same, Wide through, Wide cap, Wide reach) {
  Wide code = std::min(2 * std::max(glob + la, reach), 2 * cap);
  if (later != kNever) {
    code = std::min(code, later > glob ? 2 * later : 2 * glob + 1);
  }
  if (same != kNever) {
    code = std::min(code, 2 * std::max(same, glob) + 1);
  }
  if (code == 2 * glob + 1 && through == glob) {
    return {glob, kLockstep};
  }
  return {code / 2, code % 2 ? kThrough : kBefore};
}

/// cut_windows.why_end.
Why WhyEnd(Wide glob, Wide la, Wide same, Wide end, How how, Wide reach) {
  if (how == kLockstep) {
    return kLockstepNs;
  }
  if (how == kThrough) {
    return same != kNever && std::max(same, glob) == end ? kReleaseSame : kReleaseLater;
  }
  if (end == glob + la) {
    return kLookahead;
  }
  return end == reach ? kOutput : kReleaseLater;
}

/// cut_windows.width_bucket as an index: 0, 1, then 1 + the width's decimal digits.
uint32_t WidthIndex(int64_t width) {
  if (width <= 1) {
    return static_cast<uint32_t>(std::max<int64_t>(width, 0));
  }
  uint32_t digits = 0;
  for (int64_t w = width; w > 0; w /= 10) {
    ++digits;
  }
  return 1 + digits;
}

}  // namespace

PhantoraCutPeers::PhantoraCutPeers(uint32_t group, const std::vector<int>& fds, int64_t timeoutMs,
                                   int64_t firstTimeoutMs)
    : m_group(group),
      m_fds(fds),
      m_timeoutMs(timeoutMs),
      m_firstTimeoutMs(std::max(timeoutMs, firstTimeoutMs)),
      m_bufs(fds.size()),
      m_len(fds.size(), 0),
      m_at(fds.size(), 0),
      m_keep(fds.size(), kNone),
      m_viewAt(fds.size(), 0) {
  if (group >= fds.size()) {
    throw std::invalid_argument("PhantoraCutPeers: group " + std::to_string(group) + " of " +
                                std::to_string(fds.size()));
  }
  for (uint32_t g = 0; g < fds.size(); ++g) {
    if ((g == group) != (fds[g] < 0)) {
      throw std::invalid_argument("PhantoraCutPeers: socket " + std::to_string(fds[g]) + " for worker " +
                                  std::to_string(g) + " (one per other worker, -1 at its own group " +
                                  std::to_string(group) + ")");
    }
  }
  if (timeoutMs <= 0) {
    throw std::invalid_argument("PhantoraCutPeers: timeout " + std::to_string(timeoutMs) + " ms (must be > 0)");
  }
}

uint64_t PhantoraCutPeers::Buffered() const {
  uint64_t n = 0;
  for (uint32_t g = 0; g < m_bufs.size(); ++g) {
    n += m_len[g] - m_at[g];
  }
  return n;
}

void PhantoraCutPeers::SetBeat(int fd, int64_t everyCpuNs) {
  m_beatFd = fd;
  m_beatEveryNs = std::max<int64_t>(everyCpuNs, 0);
}

std::string PhantoraCutPeers::Closed(uint32_t g) const {
  return Worker(m_group) + ": " + Worker(g) + " closed its connection (dead)";
}

bool PhantoraCutPeers::Read(uint32_t g) {
  std::vector<uint8_t>& buf = m_bufs[g];
  std::size_t& len = m_len[g];
  const std::size_t from = std::min(m_at[g], m_keep[g]);  // the bytes before it are taken and not kept
  if (from > 0 && (from == len || (from > (std::size_t{1} << 22) && from * 2 > len))) {
    std::memmove(buf.data(), buf.data() + from, len - from);
    len -= from;
    m_at[g] -= from;
    if (m_keep[g] != kNone) {
      m_keep[g] -= from;
    }
  }
  if (buf.size() - len < kReadChunk) {
    buf.resize(len + kReadChunk);  // zero-filled only as it grows past its largest; read into directly
  }
  const ssize_t n = recv(m_fds[g], buf.data() + len, kReadChunk, MSG_DONTWAIT);
  if (n > 0) {
    len += static_cast<std::size_t>(n);
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      return true;
    }
    if (errno == ECONNRESET) {
      return false;  // it closed its end with our bytes unread: as a plain close
    }
    throw std::runtime_error(Worker(m_group) + ": " + Worker(g) + " is gone (" + std::strerror(errno) + ")");
  }
  return n > 0;
}

bool PhantoraCutPeers::Take(uint32_t g, uint64_t seq, CutReport& out, bool view) {
  const std::vector<uint8_t>& buf = m_bufs[g];
  const std::size_t left = m_len[g] - m_at[g];
  uint64_t n = 0;
  if (left < sizeof(n)) {
    return false;
  }
  std::memcpy(&n, buf.data() + m_at[g], sizeof(n));  // little-endian: this machine's order (x86-64, arm64)
  if (n > kMaxFrame) {
    throw std::runtime_error(Worker(m_group) + ": worker " + std::to_string(g) + " announced a window report of " +
                             std::to_string(n) + " bytes (at most " + std::to_string(kMaxFrame) + ")");
  }
  if (left < sizeof(n) + n) {
    return false;
  }
  Unpacker u(buf.data() + m_at[g] + sizeof(n), n);
  uint32_t fields = 0, keyLen = 0;
  int64_t got = 0;
  int64_t* ints[12] = {&got,           &out.next,       &out.minArrival, &out.later, &out.same,  &out.sampleFrom,
                       &out.reactBound, &out.reactStop,  &out.output,     &out.idle,  &out.left, &out.finish};
  bool ok = u.Array(fields) && fields == kFields;
  for (int64_t* v : ints) {
    ok = ok && u.Int(*v);
  }
  ok = ok && u.Array(keyLen) && keyLen <= kMaxKey;
  int64_t key[kMaxKey] = {};
  for (uint32_t i = 0; ok && i < keyLen; ++i) {
    ok = u.Int(key[i]);
  }
  const uint8_t* batch = nullptr;
  std::size_t batchLen = 0;
  ok = ok && u.Bin(batch, batchLen) && u.Done();
  if (!ok) {
    throw std::runtime_error(Worker(m_group) + ": " + Worker(g) + " sent a window report of " + std::to_string(n) +
                             " bytes that does not parse (a msgpack array of " + std::to_string(kFields) +
                             " fields, bridge.cut_frame)");
  }
  if (static_cast<uint64_t>(got) != seq) {
    throw std::runtime_error(Worker(m_group) + ": worker " + std::to_string(g) + " sent barrier " +
                             std::to_string(got) + " at barrier " + std::to_string(seq));
  }
  out.keyLen = std::min<uint32_t>(keyLen, 4);
  std::copy(key, key + 4, out.key);
  if (view) {
    out.batch.clear();
    out.view = nullptr;  // set once every read of the exchange is done (a read may move the buffer)
    out.viewLen = batchLen;
    m_keep[g] = m_at[g];
    m_viewAt[g] = static_cast<std::size_t>(batch - (buf.data() + m_at[g]));
  } else {
    out.batch.assign(reinterpret_cast<const char*>(batch), batchLen);
  }
  m_at[g] += sizeof(n) + n;
  return true;
}

void PhantoraCutPeers::Exchange(uint64_t seq, const CutReport& mine, const std::vector<std::string>& batches,
                                std::vector<CutReport>& out) {
  std::vector<std::pair<const char*, std::size_t>> spans;
  for (const std::string& b : batches) {
    spans.emplace_back(b.data(), b.size());
  }
  ExchangeBytes(seq, mine, spans, out);
}

void PhantoraCutPeers::Exchange(uint64_t seq, const CutReport& mine,
                                const std::vector<std::vector<uint8_t>>& batches, std::vector<CutReport>& out) {
  std::vector<std::pair<const char*, std::size_t>> spans;
  for (const std::vector<uint8_t>& b : batches) {
    spans.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  }
  ExchangeBytes(seq, mine, spans, out);
}

void PhantoraCutPeers::ExchangeViews(uint64_t seq, const CutReport& mine,
                                     const std::vector<std::pair<const char*, std::size_t>>& batches,
                                     std::vector<CutReport>& out) {
  ExchangeBytes(seq, mine, batches, out, true);
}

void PhantoraCutPeers::ExchangeBytes(uint64_t seq, const CutReport& mine,
                                     const std::vector<std::pair<const char*, std::size_t>>& batches,
                                     std::vector<CutReport>& out, bool views) {
  const uint32_t n = Groups();
  std::fill(m_keep.begin(), m_keep.end(), kNone);  // the last exchange's views are delivered
  if (batches.size() != n) {
    throw std::invalid_argument("PhantoraCutPeers::Exchange: " + std::to_string(batches.size()) +
                                " batches for " + std::to_string(n) + " workers");
  }
  out.resize(n);
  // every peer's frame up to its batch: the length (filled in per peer), the array, the fields, bin 32's header
  std::string head(sizeof(uint64_t), '\0');
  head.push_back(static_cast<char>(0x90 | kFields));
  for (const int64_t v : {static_cast<int64_t>(seq), mine.next, mine.minArrival, mine.later, mine.same,
                          mine.sampleFrom, mine.reactBound, mine.reactStop, mine.output, mine.idle, mine.left,
                          mine.finish}) {
    PutInt(head, v);
  }
  const uint32_t keyLen = std::min<uint32_t>(mine.keyLen, 4);
  head.push_back(static_cast<char>(0x90 | keyLen));
  for (uint32_t i = 0; i < keyLen; ++i) {
    PutInt(head, mine.key[i]);
  }
  head.push_back(static_cast<char>(0xc6));
  const std::size_t headLen = head.size() + 4;
  std::vector<std::string> heads(n);
  std::vector<uint64_t> sent(n, 0), total(n, 0);  // bytes of each peer's frame sent, and its size
  std::vector<bool> got(n, false);
  uint32_t missing = 0, unsent = 0;
  auto send = [&](uint32_t g) {
    const auto& [data, size] = batches[g];
    while (sent[g] < total[g]) {
      iovec iov[2];
      int cnt = 0;
      if (sent[g] < headLen) {
        iov[cnt++] = {heads[g].data() + sent[g], headLen - sent[g]};
      }
      const uint64_t from = sent[g] > headLen ? sent[g] - headLen : 0;
      if (size > from) {
        iov[cnt++] = {const_cast<char*>(data) + from, size - from};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(cnt);
      const ssize_t k = sendmsg(m_fds[g], &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          return;
        }
        if (errno == EPIPE || errno == ECONNRESET) {
          throw std::runtime_error(Closed(g));
        }
        throw std::runtime_error(Worker(m_group) + ": " + Worker(g) + " is gone (" + std::strerror(errno) + ")");
      }
      sent[g] += static_cast<uint64_t>(k);
    }
  };
  for (uint32_t g = 0; g < n; ++g) {
    if (g == m_group) {
      continue;
    }
    const std::size_t batchSize = batches[g].second;
    if (batchSize > kMaxBatch) {
      throw std::runtime_error(Worker(m_group) + ": a batch of " + std::to_string(batchSize) + " bytes for " +
                               Worker(g) + " (at most " + std::to_string(kMaxBatch) + ")");
    }
    heads[g] = head;
    PutBig(heads[g], batchSize, 4);
    const uint64_t body = headLen - sizeof(uint64_t) + batchSize;
    std::memcpy(heads[g].data(), &body, sizeof(body));
    total[g] = headLen + batchSize;
    send(g);
    unsent += sent[g] < total[g];
    got[g] = Take(g, seq, out[g], views);
    missing += !got[g];
  }
  const int64_t limit = seq == 0 ? m_firstTimeoutMs : m_timeoutMs;
  int64_t deadline = WallNs() + limit * 1000000;
  std::vector<pollfd> fds;
  std::vector<uint32_t> who;
  while (missing > 0 || unsent > 0) {
    fds.clear();
    who.clear();
    for (uint32_t g = 0; g < n; ++g) {
      if (g != m_group && (!got[g] || sent[g] < total[g])) {
        fds.push_back({m_fds[g], static_cast<short>(POLLIN | (sent[g] < total[g] ? POLLOUT : 0)), 0});
        who.push_back(g);
      }
    }
    const int64_t left = deadline - WallNs();
    if (left <= 0) {
      std::string waiting;
      for (uint32_t g = 0; g < n; ++g) {
        if (g != m_group && (!got[g] || sent[g] < total[g])) {
          waiting += (waiting.empty() ? "" : ", ") + std::to_string(g);
        }
      }
      throw std::runtime_error(Worker(m_group) + ": no word from partition worker(s) [" + waiting +
                               "] at barrier " + std::to_string(seq) + " (dead or stuck)");
    }
    const int rc = poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 1 << 30)));
    if (rc < 0) {
      if (errno == EINTR) {
        StopIfInterrupted(m_group);
        continue;
      }
      throw std::runtime_error(Worker(m_group) + ": poll failed (" + std::strerror(errno) + ")");
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      const uint32_t g = who[i];
      const short ev = fds[i].revents;
      if (ev & POLLOUT) {
        send(g);
        unsent -= sent[g] >= total[g];
      }
      if (ev & (POLLIN | POLLHUP | POLLERR)) {
        const bool open = Read(g);
        if (!got[g] && Take(g, seq, out[g], views)) {
          got[g] = true;
          --missing;
        }
        if (!open && (!got[g] || sent[g] < total[g])) {
          throw std::runtime_error(Closed(g));  // it closed its end before saying all it had to
        }
      }
    }
    if (rc > 0) {
      deadline = WallNs() + limit * 1000000;  // progress
    }
  }
  for (uint32_t g = 0; views && g < n; ++g) {
    if (g != m_group) {
      out[g].view = m_bufs[g].data() + m_keep[g] + m_viewAt[g];
    }
  }
}

std::vector<int64_t> PhantoraCutRunWindows(PhantoraNetwork& net, PhantoraCutPeers* peers,
                                           const std::vector<int64_t>& args) {
  if (peers == nullptr || args.empty()) {
    return {};
  }
  if (args.size() != 7) {
    throw std::invalid_argument("PhantoraCutRunWindows: 7 args (group, lookahead, until, sampling, reacting, "
                                "first seq, finish), got " + std::to_string(args.size()));
  }
  const uint32_t group = static_cast<uint32_t>(args[0]);
  const int64_t la = args[1];
  const bool sampling = args[3] != 0;
  const bool reacting = args[4] != 0;
  uint64_t seq = static_cast<uint64_t>(args[5]);
  const bool finish = args[6] != 0;  // (with `until` too: a stepped drain's last rounds, cut_windows.run_windows)
  const uint32_t groups = peers->Groups();
  if (group != peers->Group() || groups > net.CutGroups()) {
    throw std::invalid_argument("PhantoraCutRunWindows: worker " + std::to_string(group) + " (of " +
                                std::to_string(net.CutGroups()) + " groups) with the sockets of worker " +
                                std::to_string(peers->Group()) + " of " + std::to_string(groups));
  }
  if (la <= 0) {
    throw std::invalid_argument(Worker(group) + ": lookahead must be > 0 ns, got " + std::to_string(la));
  }
  bool haveUntil = args[2] >= 0;
  int64_t until = args[2];
  int64_t stopped = -1;
  int64_t windows = 0, bytesOut = 0, lockRounds = 0, runCpu = 0, exchWall = 0;
  std::vector<int64_t> why(kCutWhyCount, 0), widths(kCutWidths, 0);
  std::vector<std::vector<uint8_t>> batches(groups);  // swapped with the outboxes: each keeps its bytes' room
  std::vector<std::pair<const char*, std::size_t>> spans(groups, {nullptr, 0});  // their messages
  std::vector<CutReport> reports;
  int64_t minArrival = kNever;
  int64_t start = -1, through = -1, lock = -1, sampled = kNever;
  bool opening = true;  // the run's first barrier (a period known there began before it)
  const int beatFd = peers->BeatFd();
  const int64_t beatEvery = peers->BeatEveryNs();
  const int64_t cpu0 = CpuNs();  // (a beat's CPU: this call's)
  int64_t lastBeat = cpu0;
  auto exchange = [&](const CutReport& mine) {
    const int64_t w0 = WallNs();
    peers->ExchangeViews(seq, mine, spans, reports);
    exchWall += WallNs() - w0;
    ++seq;
  };
  while (true) {
    CutReport mine;
    mine.next = OrNever(net.NextEventTime());
    mine.minArrival = minArrival;
    const std::vector<int64_t> rel = net.CutReleaseBounds(std::max<int64_t>(start, 0));
    mine.later = OrNever(rel[0]);
    mine.same = OrNever(rel[1]);
    if (sampling) {
      mine.sampleFrom = OrNever(net.CutSamplingFrom());
      mine.idle = OrNever(net.CutIdleSince());
    }
    if (reacting) {
      const std::vector<int64_t> rb = net.CutReactBounds(std::max<int64_t>(start, 0));
      mine.reactBound = OrNever(rb[0]);
      mine.reactStop = OrNever(rb[1]);
    }
    if (finish) {
      const std::vector<int64_t> fb = net.CutFinishBound();
      mine.left = fb[0];
      mine.finish = fb[1];
    }
    mine.output = OrNever(net.CutOutputBound());
    exchange(mine);
    int64_t glob = std::min(mine.next, minArrival);
    int64_t later = mine.later, same = mine.same, bound = mine.reactBound, stop = mine.reactStop;
    int64_t reach = mine.output;
    bool othersBusy = false;
    int64_t idle = mine.idle;  // the ns every worker's last flow had left by (NEVER: one has flows)
    int64_t left = mine.left, last = mine.finish;  // a run to the last completion: flows in flight, their bound
    const int64_t known = sampled;
    sampled = std::min({sampled, mine.sampleFrom});
    for (uint32_t g = 0; g < groups; ++g) {
      if (g == group) {
        continue;
      }
      const CutReport& r = reports[g];
      if (r.viewLen > 0) {
        net.CutDeliverBytes(r.view, r.viewLen);
      }
      glob = std::min({glob, r.next, r.minArrival});
      later = std::min(later, r.later);
      same = std::min(same, r.same);
      bound = std::min(bound, r.reactBound);
      stop = std::min(stop, r.reactStop);
      reach = std::min(reach, r.output);
      sampled = std::min(sampled, r.sampleFrom);
      othersBusy = othersBusy || r.idle == kNever;
      idle = std::max(idle, r.idle);
      left += r.left;
      last = std::max(last, r.finish);
    }
    if (stop != kNever && (!haveUntil || stop < until)) {
      until = stopped = stop;
      haveUntil = true;
    }
    if (sampling) {  // cut_windows.run_windows: a period begun in the last window, its end
      if (known == kNever && sampled != kNever && !opening) {  // its joiners' first samples, at its start
        glob = std::min(glob, sampled);
      }
      if (net.CutSampling(sampled == kNever ? -1 : sampled, othersBusy, idle == kNever ? -1 : idle, glob)) {
        sampled = kNever;
      }
    }
    opening = false;
    if (glob == kNever || (haveUntil && glob > until) || (finish && left == 0)) {
      break;
    }
    const Wide cap = sampling && sampled == kNever && idle == kNever ? Wide(glob) + 1 : Wide(kNever);
    const Wide reactCap = bound == kNever ? Wide(kNever) : Wide(std::max(bound, glob)) + 1;
    // the last completion is at or after every bound and glob (flows are still in flight): run the events before
    // the greatest bound; once at it, its ns in lockstep rounds, which stop at the last completion's event
    const bool finishLock = finish && last <= glob;
    const Wide finishCap = finish && !finishLock ? Wide(last) : Wide(kNever);
    auto [end, how] = WindowEnd(glob, la, later, same, through, std::min({cap, reactCap, finishCap}), reach);
    Why w = WhyEnd(glob, la, same, end, how, reach);
    if (how == kBefore && end == cap && w != kLookahead) {
      w = kSamplingStart;
    } else if (how == kBefore && end == reactCap && w != kLookahead) {
      w = kReact;
    } else if (how == kBefore && end == finishCap && w != kLookahead) {
      w = kFinish;
    }
    if (lock == glob) {
      how = kLockstep;
      w = kLockstepNs;
    } else if (finishLock) {
      how = kLockstep;
      w = kFinish;
    }
    // (a finishing lockstep round stays one: glob <= until, and it stops at the last completion's event)
    if (haveUntil && end > until && !(finish && how == kLockstep)) {
      end = Wide(until) + 1;
      how = kBefore;
      w = kUntil;
    }
    const int64_t e = static_cast<int64_t>(std::min(end, Wide(kNever)));
    start = glob;
    through = how == kThrough ? e : how == kLockstep ? glob : -1;
    const int64_t c0 = CpuNs();
    if (how == kLockstep) {
      // cut_windows._lockstep_round: the worker with the least next key at glob runs its events of glob while
      // they order before every other worker's, stopping after one that releases a flow elsewhere
      lock = glob;
      const std::vector<int64_t> k = net.CutNextKey();
      CutReport key;
      key.keyLen = static_cast<uint32_t>(std::min<std::size_t>(k.size(), 4));
      std::copy(k.begin(), k.begin() + key.keyLen, key.key);
      std::fill(spans.begin(), spans.end(), std::pair<const char*, std::size_t>{nullptr, 0});
      exchange(key);
      net.CutLockstep(glob, static_cast<uint32_t>(seq));
      bool least = key.keyLen == 4 && key.key[0] == glob;
      std::vector<int64_t> others;
      for (uint32_t g = 0; g < groups; ++g) {
        const CutReport& r = reports[g];
        if (g == group || r.keyLen != 4 || r.key[0] != glob) {
          continue;
        }
        const std::vector<int64_t> rk(r.key + 1, r.key + 4);
        if (others.empty() || rk < others) {
          others = rk;
        }
        if (least && !(std::vector<int64_t>(key.key + 1, key.key + 4) < rk)) {
          least = false;  // Python's min over {others..., this one}: the first least, others listed first
        }
      }
      if (least) {
        if (finish) {
          net.CutFinishAfter(left);
        }
        net.CutRunLeast(glob, others);
      }
      ++lockRounds;
    } else if (how == kThrough) {
      net.CutRunThrough(e);
    } else {
      net.CutRunBefore(e);
    }
    const int64_t c1 = CpuNs();
    runCpu += c1 - c0;
    if (beatFd >= 0 && c1 - lastBeat >= beatEvery) {
      lastBeat = c1;
      WriteBeat(beatFd, net.Now(), Simulator::GetEventCount(), c1 - cpu0);
    }
    StopIfInterrupted(group);
    ++windows;
    ++why[w];
    ++widths[WidthIndex(how == kLockstep ? 0 : e - glob + (how == kThrough))];
    net.CutShareBounds(glob);
    for (uint32_t g = 0; g < groups; ++g) {
      if (g != group) {
        const std::size_t len = net.CutSwapOutbox(g, batches[g]);
        spans[g] = {reinterpret_cast<const char*>(batches[g].data()), len};
        bytesOut += static_cast<int64_t>(len);
      }
    }
    minArrival = OrNever(net.CutTakeMinArrival());
  }
  if (haveUntil) {
    net.CutAdvanceTo(until);
  }
  std::vector<int64_t> out = {stopped, static_cast<int64_t>(seq), windows, bytesOut, lockRounds, runCpu, exchWall};
  out.insert(out.end(), why.begin(), why.end());
  out.insert(out.end(), widths.begin(), widths.end());
  return out;
}

std::vector<int64_t> PhantoraCutExchangeRounds(PhantoraCutPeers& peers, uint64_t firstSeq, uint64_t rounds,
                                               uint64_t batchBytes) {
  if (batchBytes > PhantoraCutPeers::kMaxBatch) {
    throw std::invalid_argument("PhantoraCutExchangeRounds: a batch of " + std::to_string(batchBytes) + " bytes");
  }
  const std::vector<char> batch(batchBytes, 0);
  std::vector<std::pair<const char*, std::size_t>> batches(peers.Groups(), {batch.data(), batch.size()});
  batches[peers.Group()] = {nullptr, 0};
  std::vector<CutReport> reports;
  CutReport mine;
  const int64_t c0 = CpuNs(), w0 = WallNs();
  for (uint64_t i = 0; i < rounds; ++i) {
    mine.next = static_cast<int64_t>(100 * (firstSeq + i));  // a report with its fields set, as a window's
    mine.minArrival = mine.next + 1000;
    peers.ExchangeViews(firstSeq + i, mine, batches, reports);  // as the window loop's barriers
    StopIfInterrupted(peers.Group());
  }
  return {CpuNs() - c0, WallNs() - w0};
}

}  // namespace ns3
