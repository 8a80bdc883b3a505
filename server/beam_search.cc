#include "server/beam_search.h"

#include <algorithm>
#include <cmath>

namespace kvrm {
namespace {

// vLLM's score of a beam of `tokens` generated tokens (an ended one's last its EOS).
double Score(double cum_logprob, int64_t tokens, bool ended, const BeamSearchConfig& config) {
  const int64_t length = std::max<int64_t>(config.prompt_tokens + tokens - (ended ? 1 : 0), 1);
  return cum_logprob / std::pow(static_cast<double>(length), config.length_penalty);
}

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
  return Score(beam.cum_logprob, static_cast<int64_t>(beam.tokens.size()), beam.ended, config);
}

std::vector<Beam> BeamStep(const std::vector<Beam>& beams,
                           const std::vector<std::vector<std::pair<int32_t, float>>>& candidates,
                           const BeamSearchConfig& config, std::vector<Beam>* completed) {
  const size_t width = static_cast<size_t>(std::max(config.width, 0));
  // Every extension ranked by score first (no token vector copied), the winners built after.
  struct Extension {
    double score;
    size_t beam;
    size_t candidate;
  };
  std::vector<Extension> extensions;
  for (size_t b = 0; b < beams.size() && b < candidates.size(); ++b) {
    const int64_t tokens = static_cast<int64_t>(beams[b].tokens.size()) + 1;
    for (size_t c = 0; c < candidates[b].size(); ++c) {
      const auto& [token, logprob] = candidates[b][c];
      if (!std::isfinite(logprob)) continue;  // a masked token is no candidate
      const double cum_logprob = beams[b].cum_logprob + logprob;
      if (IsEos(token, config)) {
        Beam& ended = completed->emplace_back(beams[b]);
        ended.tokens.push_back(token);
        ended.cum_logprob = cum_logprob;
        ended.ended = true;
      } else {
        extensions.push_back({Score(cum_logprob, tokens, false, config), b, c});
      }
    }
  }
  std::stable_sort(extensions.begin(), extensions.end(),
                   [](const Extension& a, const Extension& b) { return a.score > b.score; });
  std::vector<Beam> next;
  for (size_t k = 0; k < extensions.size() && k < width; ++k) {
    const Extension& e = extensions[k];
    Beam& extended = next.emplace_back(beams[e.beam]);
    extended.tokens.push_back(candidates[e.beam][e.candidate].first);
    extended.cum_logprob += candidates[e.beam][e.candidate].second;
  }
  // An ended beam's score never changes: only the best `width` of them can be in the answer, so
  // the rest are dropped now (a search of thousands of steps keeps `width` of them, not all).
  if (completed->size() > width) *completed = Best(std::move(*completed), width, config);
  return next;
}

std::vector<Beam> BestBeams(std::vector<Beam> completed, std::vector<Beam> live,
                            const BeamSearchConfig& config) {
  for (Beam& b : live) completed.push_back(std::move(b));
  return Best(std::move(completed), static_cast<size_t>(std::max(config.width, 0)), config);
}

}  // namespace kvrm
