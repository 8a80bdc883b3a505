#include "server/beam_search.h"

#include <algorithm>
#include <cmath>

namespace kvrm {
namespace {

bool IsEos(int32_t token, const BeamSearchConfig& config) {
  return !config.ignore_eos &&
         std::find(config.eos_ids.begin(), config.eos_ids.end(), token) != config.eos_ids.end();
}

// The best `keep` of `beams` by score, in score order; equal scores keep their order.
std::vector<Beam> Best(std::vector<Beam> beams, size_t keep, const BeamSearchConfig& config) {
  std::vector<std::pair<double, size_t>> order(beams.size());
  for (size_t i = 0; i < beams.size(); ++i) order[i] = {BeamScore(beams[i], config), i};
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Beam> out;
  out.reserve(std::min(keep, order.size()));
  for (size_t k = 0; k < order.size() && k < keep; ++k) {
    out.push_back(std::move(beams[order[k].second]));
  }
  return out;
}

}  // namespace

double BeamScore(const Beam& beam, const BeamSearchConfig& config) {
  int64_t length = config.prompt_tokens + static_cast<int64_t>(beam.tokens.size());
  if (beam.ended) --length;
  length = std::max<int64_t>(length, 1);
  return beam.cum_logprob / std::pow(static_cast<double>(length), config.length_penalty);
}

std::vector<Beam> BeamStep(const std::vector<Beam>& beams,
                           const std::vector<std::vector<std::pair<int32_t, float>>>& candidates,
                           const BeamSearchConfig& config, std::vector<Beam>* completed) {
  std::vector<Beam> extended;
  for (size_t b = 0; b < beams.size() && b < candidates.size(); ++b) {
    for (const auto& [token, logprob] : candidates[b]) {
      if (!std::isfinite(logprob)) continue;  // a masked token is no candidate
      Beam next = beams[b];
      next.tokens.push_back(token);
      next.cum_logprob += logprob;
      if (IsEos(token, config)) {
        next.ended = true;
        completed->push_back(std::move(next));
      } else {
        extended.push_back(std::move(next));
      }
    }
  }
  return Best(std::move(extended), static_cast<size_t>(std::max(config.width, 0)), config);
}

std::vector<Beam> BestBeams(std::vector<Beam> completed, std::vector<Beam> live,
                            const BeamSearchConfig& config) {
  for (Beam& b : live) completed.push_back(std::move(b));
  return Best(std::move(completed), static_cast<size_t>(std::max(config.width, 0)), config);
}

}  // namespace kvrm
