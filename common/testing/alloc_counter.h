// Counting replacements of the global allocation functions, for tests that prove a code path
// never allocates (the decode step, the sampler, metric recording). Linking this library into a
// test binary replaces operator new/delete for the whole binary.
#ifndef KVRM_COMMON_TESTING_ALLOC_COUNTER_H_
#define KVRM_COMMON_TESTING_ALLOC_COUNTER_H_

#include <cstdint>

namespace kvrm::alloc_counter {

// Heap allocations through operator new since the program started (any thread).
int64_t AllocationCount();

// False under AddressSanitizer or ThreadSanitizer, whose own allocator replacement takes
// precedence over ours: no-allocation tests skip there (they run in the normal build).
inline constexpr bool kAvailable =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    false;
#else
    true;
#endif

}  // namespace kvrm::alloc_counter

#endif  // KVRM_COMMON_TESTING_ALLOC_COUNTER_H_
