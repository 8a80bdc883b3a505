#include "bench/families.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvrm::bench {

std::vector<Family> PaperFamilies(int max_context) {
  const double k = max_context / 4096.0;
  auto scaled = [&](int in, int out, int weight) {
    return absl::StrCat(std::max(1, static_cast<int>(in * k)), ":",
                        std::max(1, static_cast<int>(out * k)), ":", weight);
  };
  return {
      {"short", "short chat",
       absl::StrCat(scaled(256, 256, 2), ",", scaled(128, 384, 1), ",", scaled(512, 128, 1)), 30},
      {"mixed", "mixed multi-hop",
       absl::StrCat(scaled(300, 200, 5), ",", scaled(1200, 250, 3), ",", scaled(2800, 250, 2)),
       20},
      {"long", "long-document QA", absl::StrCat(scaled(1500, 100, 1), ",", scaled(2000, 150, 1)),
       12},
  };
}

KvBudget ClaimsKvBudget(int max_context, int slots, double fraction) {
  KvBudget b;
  b.blocks_per_slot = (max_context + 15) / 16;
  b.kv_blocks = std::max<int64_t>(b.blocks_per_slot,
                                  static_cast<int64_t>(fraction * slots * b.blocks_per_slot));
  return b;
}

}  // namespace kvrm::bench
