// Free lists for the objects made and freed once per packet or per event (packets, hot events).
#ifndef PHANTORA_POOL_H
#define PHANTORA_POOL_H

#include <cstddef>
#include <new>

namespace ns3 {

/**
 * A free list of blocks of sizeof(T): what `operator new` / `operator delete` of T use, so a packet or an
 * event costs no malloc once the pool holds as many as were ever alive at once. Blocks are kept for the
 * life of the process. ns-3's default simulator runs on one thread, as do these pools.
 */
template <typename T>
class Pool {
 public:
  static void* Get(std::size_t size) {
    if (size != sizeof(T)) {  // a subclass without its own pool
      if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
        return ::operator new(size, std::align_val_t{alignof(T)});
      } else {
        return ::operator new(size);
      }
    }
    if (s_free == nullptr) {
      if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
        return ::operator new(sizeof(Block), std::align_val_t{alignof(T)});  // a cache-line-aligned class
      } else {
        return ::operator new(sizeof(Block));
      }
    }
    Block* b = s_free;
    s_free = b->next;
    return b;
  }
  static void Put(void* p, std::size_t size) {
    if (size != sizeof(T)) {
      if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
        ::operator delete(p, std::align_val_t{alignof(T)});
      } else {
        ::operator delete(p);
      }
      return;
    }
    Block* b = static_cast<Block*>(p);
    b->next = s_free;
    s_free = b;
  }

 private:
  union Block {
    Block* next;
    alignas(T) unsigned char bytes[sizeof(T)];
  };
  static inline Block* s_free = nullptr;
};

/// `operator new` / `operator delete` of class T from Pool<T> (put inside T's definition).
#define PHANTORA_POOLED(T)                                                          \
  static void* operator new(std::size_t size) { return ::ns3::Pool<T>::Get(size); } \
  static void operator delete(void* p, std::size_t size) { ::ns3::Pool<T>::Put(p, size); }

}  // namespace ns3

#endif  // PHANTORA_POOL_H
