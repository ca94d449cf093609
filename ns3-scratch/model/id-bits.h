// A set of flow ids at one bit an id, for what a long run keeps of every finished flow (issue 38).
#ifndef PHANTORA_ID_BITS_H
#define PHANTORA_ID_BITS_H

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ns3 {

/**
 * Ids below kLimit, one bit each in words that grow to the largest id held (the dense ids phantora's callers
 * number flows by, from 0); Insert refuses any other id, which the caller keeps where it kept it before.
 */
class IdBits {
 public:
  static constexpr uint64_t kLimit = uint64_t{1} << 28;  ///< at most 32 MiB of words

  /// Adds `id`; false (nothing done) if it is not below kLimit.
  bool Insert(uint64_t id) {
    if (id >= kLimit) {
      return false;
    }
    const std::size_t w = id >> 6;
    if (w >= m_words.size()) {
      m_words.resize(w + 1);
    }
    const uint64_t bit = uint64_t{1} << (id & 63);
    m_size += (m_words[w] & bit) ? 0 : 1;
    m_words[w] |= bit;
    return true;
  }
  bool Has(uint64_t id) const {
    const uint64_t w = id >> 6;
    return w < m_words.size() && (m_words[w] >> (id & 63) & 1);
  }
  std::size_t Size() const { return m_size; }
  /// The least id held that is >= `id`, or UINT64_MAX if none.
  uint64_t NextFrom(uint64_t id) const {
    std::size_t w = id >> 6;
    if (w >= m_words.size()) {
      return UINT64_MAX;
    }
    uint64_t bits = m_words[w] & (~uint64_t{0} << (id & 63));
    while (bits == 0) {
      if (++w == m_words.size()) {
        return UINT64_MAX;
      }
      bits = m_words[w];
    }
    return (uint64_t{w} << 6) | static_cast<uint64_t>(std::countr_zero(bits));
  }

 private:
  std::vector<uint64_t> m_words;
  std::size_t m_size = 0;
};

}  // namespace ns3

#endif  // PHANTORA_ID_BITS_H
