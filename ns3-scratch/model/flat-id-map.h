// An id -> object table for the per-packet lookups (a NIC's queue pairs and receivers by flow id).
#ifndef PHANTORA_FLAT_ID_MAP_H
#define PHANTORA_FLAT_ID_MAP_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace ns3 {

/**
 * Owns one T per uint64_t id. Open addressing with linear probing in one array of (id, pointer) slots, a power of
 * two long and at most half full, so a lookup is a multiply, a shift and usually one cache line; erasing shifts
 * the following slots back (no tombstones). Objects are allocated one by one and never move, so a T& stays valid
 * while other ids come and go. Iteration order is the slots' (not insertion order): callers that need an order
 * sort.
 */
template <typename T>
class FlatIdMap {
 public:
  /// The object of `id`, or nullptr.
  T* Find(uint64_t id) const {
    if (m_size == 0) {
      return nullptr;
    }
    for (std::size_t i = Home(id);; i = (i + 1) & m_mask) {
      const Slot& s = m_slots[i];
      if (!s.val) {
        return nullptr;
      }
      if (s.id == id) {
        return s.val.get();
      }
    }
  }
  /// The object of `id`, made (value-initialised) if it has none.
  T& Get(uint64_t id) {
    if (T* t = Find(id)) {
      return *t;
    }
    return *Put(id, std::make_unique<T>());
  }
  /// Gives `id` the object `t` (replacing the one it had); returns it.
  T* Put(uint64_t id, std::unique_ptr<T> t) {
    if (2 * (m_size + 1) > m_slots.size()) {
      Grow();
    }
    std::size_t i = Home(id);
    for (; m_slots[i].val; i = (i + 1) & m_mask) {
      if (m_slots[i].id == id) {
        m_slots[i].val = std::move(t);
        return m_slots[i].val.get();
      }
    }
    m_slots[i].id = id;
    m_slots[i].val = std::move(t);
    ++m_size;
    return m_slots[i].val.get();
  }
  /// Frees the object of `id`, if any; true if there was one.
  bool Erase(uint64_t id) {
    if (m_size == 0) {
      return false;
    }
    std::size_t i = Home(id);
    for (; m_slots[i].id != id || !m_slots[i].val; i = (i + 1) & m_mask) {
      if (!m_slots[i].val) {
        return false;
      }
    }
    m_slots[i].val.reset();
    --m_size;
    // Backward shift: move each later slot of the run into the hole if its home does not lie after the hole.
    for (std::size_t j = (i + 1) & m_mask; m_slots[j].val; j = (j + 1) & m_mask) {
      const std::size_t home = Home(m_slots[j].id);
      if (((j - home) & m_mask) >= ((j - i) & m_mask)) {
        m_slots[i] = std::move(m_slots[j]);
        i = j;
      }
    }
    return true;
  }
  std::size_t size() const { return m_size; }
  void Clear() {
    m_slots.clear();
    m_mask = 0;
    m_shift = 64;
    m_size = 0;
  }
  /// f(id, T&) for every entry, in slot order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : m_slots) {
      if (s.val) {
        f(s.id, *s.val);
      }
    }
  }

 private:
  struct Slot {
    uint64_t id = 0;
    std::unique_ptr<T> val;  ///< null: the slot is free
  };

  std::size_t Home(uint64_t id) const {
    return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ull) >> m_shift) & m_mask;  // Fibonacci hashing
  }
  void Grow() {
    std::vector<Slot> old;
    old.swap(m_slots);
    const std::size_t n = old.empty() ? 16 : 2 * old.size();
    m_slots.resize(n);
    m_mask = n - 1;
    m_shift = 64 - static_cast<unsigned>(__builtin_ctzll(n));
    m_size = 0;
    for (Slot& s : old) {
      if (s.val) {
        Put(s.id, std::move(s.val));
      }
    }
  }

  std::vector<Slot> m_slots;
  std::size_t m_mask = 0;
  unsigned m_shift = 64;
  std::size_t m_size = 0;
};

}  // namespace ns3

#endif  // PHANTORA_FLAT_ID_MAP_H
