// Counting replacements of the global allocation functions (see alloc_counter.h).
#include "common/testing/alloc_counter.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace kvrm::alloc_counter {
namespace {
std::atomic<int64_t> allocations{0};
}  // namespace

int64_t AllocationCount() { return allocations.load(std::memory_order_relaxed); }

}  // namespace kvrm::alloc_counter

namespace {

void* CountedAlloc(std::size_t size) {
  kvrm::alloc_counter::allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}

void* CountedAlignedAlloc(std::size_t size, std::align_val_t align) {
  kvrm::alloc_counter::allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t a = static_cast<std::size_t>(align);
  const std::size_t rounded = ((size == 0 ? 1 : size) + a - 1) / a * a;  // aligned_alloc needs it
  return std::aligned_alloc(a, rounded);
}

}  // namespace

void* operator new(std::size_t size) {
  void* p = CountedAlloc(size);
  if (p == nullptr) std::abort();  // The test binary does not use exceptions.
  return p;
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return CountedAlloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return CountedAlloc(size);
}
void* operator new(std::size_t size, std::align_val_t align) {
  void* p = CountedAlignedAlloc(size, align);
  if (p == nullptr) std::abort();
  return p;
}
void* operator new[](std::size_t size, std::align_val_t align) { return operator new(size, align); }

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
