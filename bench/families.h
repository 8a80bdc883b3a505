// What the claims benchmarks (paper_claims through kvrmd, engine_claims in process) share, so
// that both run the same setup: the paper's three workload families as token-length mixes
// (tools/replay ParseLengthMix format), and the KV budget both modes get.
#ifndef KVRM_BENCH_FAMILIES_H_
#define KVRM_BENCH_FAMILIES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvrm::bench {

struct Family {
  std::string name;         // short, mixed, long
  std::string description;  // for tables
  std::string mix;          // "in:out:weight,..." scaled to the model's context
  double rate = 0;          // default Poisson arrivals per second (paper_claims)
};

// Lengths are defined for a 4096-token context and scaled by max_context / 4096 (each at least
// one token).
std::vector<Family> PaperFamilies(int max_context);

// Both modes' KV budget: `fraction` of slots x max context, in 16-token blocks (kvrmd's default
// block), at least one slot's worth. Static backs kv_blocks / blocks_per_slot slots of it.
struct KvBudget {
  int64_t blocks_per_slot = 0;
  int64_t kv_blocks = 0;
};
KvBudget ClaimsKvBudget(int max_context, int slots, double fraction);

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_FAMILIES_H_
