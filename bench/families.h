// The paper's three workload families as token-length mixes (tools/replay ParseLengthMix
// format), shared by the claims benchmarks (paper_claims through kvrmd, engine_claims in
// process) so that both replay the same lengths.
#ifndef KVRM_BENCH_FAMILIES_H_
#define KVRM_BENCH_FAMILIES_H_

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

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_FAMILIES_H_
