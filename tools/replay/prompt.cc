#include "tools/replay/prompt.h"

#include <algorithm>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvrm::replay {
namespace {

// SplitMix64 finaliser: decorrelates seeds built from small integers.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kBlockStream = 1;
constexpr uint64_t kTailStream = 2;

}  // namespace

absl::StatusOr<PromptSynthesizer> PromptSynthesizer::Create(int vocab_size,
                                                            absl::Span<const int32_t> special_ids,
                                                            uint64_t seed) {
  const absl::flat_hash_set<int32_t> special(special_ids.begin(), special_ids.end());
  std::vector<int32_t> allowed;
  allowed.reserve(std::max(vocab_size, 0));
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (!special.contains(id)) allowed.push_back(id);
  }
  if (allowed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no usable token ids: vocabulary of ", vocab_size, " minus special ids"));
  }
  return PromptSynthesizer(std::move(allowed), seed);
}

void PromptSynthesizer::AppendRandom(uint64_t stream, uint64_t key, int count,
                                     std::vector<int32_t>* out) const {
  std::mt19937_64 rng(Mix(Mix(seed_ ^ stream) ^ key));
  std::uniform_int_distribution<size_t> pick(0, allowed_.size() - 1);
  for (int i = 0; i < count; ++i) out->push_back(allowed_[pick(rng)]);
}

std::vector<int32_t> PromptSynthesizer::Synthesize(const PlannedRequest& request) const {
  std::vector<int32_t> ids;
  ids.reserve(request.input_tokens);
  const int block = std::max(1, request.hash_block_tokens);
  for (int64_t hash : request.hash_ids) {
    const int remaining = request.input_tokens - static_cast<int>(ids.size());
    if (remaining <= 0) break;
    // The block is generated whole and cut, so a short last block is a prefix of the full one.
    std::vector<int32_t> full;
    full.reserve(block);
    AppendRandom(kBlockStream, static_cast<uint64_t>(hash), block, &full);
    ids.insert(ids.end(), full.begin(), full.begin() + std::min(block, remaining));
  }
  const int tail = request.input_tokens - static_cast<int>(ids.size());
  if (tail > 0) AppendRandom(kTailStream, static_cast<uint64_t>(request.index), tail, &ids);
  return ids;
}

}  // namespace kvrm::replay
