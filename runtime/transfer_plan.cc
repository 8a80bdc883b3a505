#include "runtime/transfer_plan.h"

#include <algorithm>

namespace kvrm {

void PlanTransferGroups(absl::Span<BlockMove> moves, std::vector<TransferGroup>* groups) {
  // Order by (src tier, dst tier, src): a chain that can merge is then adjacent.
  std::sort(moves.begin(), moves.end(), [](const BlockMove& a, const BlockMove& b) {
    if (a.src_tier != b.src_tier) return a.src_tier < b.src_tier;
    if (a.dst_tier != b.dst_tier) return a.dst_tier < b.dst_tier;
    return a.src < b.src;
  });
  for (const BlockMove& m : moves) {
    if (!groups->empty()) {
      TransferGroup& g = groups->back();
      if (g.src_tier == m.src_tier && g.dst_tier == m.dst_tier &&
          g.src_first + g.num_blocks == m.src && g.dst_first + g.num_blocks == m.dst) {
        ++g.num_blocks;
        continue;
      }
    }
    groups->push_back(TransferGroup{m.src_tier, m.src, m.dst_tier, m.dst, 1});
  }
}

}  // namespace kvrm
