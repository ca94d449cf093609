// A FIFO in one ring of slots that keeps its room: the per-port packet queues (no allocation per packet).
#ifndef PHANTORA_RING_QUEUE_H
#define PHANTORA_RING_QUEUE_H

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace ns3 {

/**
 * The std::deque operations the packet queues use (push_back, front, pop_front, empty, size), in a ring of a
 * power-of-two number of slots that grows (doubling) and never shrinks. A std::deque allocates a 512-byte block
 * for every 16 TxItems that pass through it and frees it when they have left, so a busy queue's writes always went
 * to new memory; the ring writes the slots it used last. A slot left is reset to T{} (a packet's reference goes
 * when it leaves, as from a deque).
 */
template <typename T>
class RingQueue {
 public:
  bool empty() const { return m_size == 0; }
  std::size_t size() const { return m_size; }
  T& front() { return m_slots[m_head]; }
  const T& front() const { return m_slots[m_head]; }
  void push_back(T&& v) {
    if (m_size == m_slots.size()) {
      Grow();
    }
    m_slots[(m_head + m_size) & (m_slots.size() - 1)] = std::move(v);
    ++m_size;
  }
  void push_back(const T& v) { push_back(T(v)); }
  void pop_front() {
    m_slots[m_head] = T{};
    m_head = (m_head + 1) & (m_slots.size() - 1);
    --m_size;
  }

 private:
  void Grow() {
    std::vector<T> bigger(std::max<std::size_t>(8, 2 * m_slots.size()));
    for (std::size_t i = 0; i < m_size; ++i) {
      bigger[i] = std::move(m_slots[(m_head + i) & (m_slots.size() - 1)]);
    }
    m_slots.swap(bigger);
    m_head = 0;
  }

  std::vector<T> m_slots;  ///< a power of two of them (or none)
  std::size_t m_head = 0;  ///< the front's slot
  std::size_t m_size = 0;
};

}  // namespace ns3

#endif  // PHANTORA_RING_QUEUE_H
