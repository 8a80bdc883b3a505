// Beam search (GenerateRequest.beam_search; vLLM's use_beam_search), the selection half: how the
// live beams and their scored next tokens become the next beams, and which beams are the
// answer. The service (server/kvrm_service.cc) scores each step's beams with one-token engine
// requests, as vLLM's beam search does, and calls these. Pure functions: no I/O, no engine.
#ifndef KVRM_SERVER_BEAM_SEARCH_H_
#define KVRM_SERVER_BEAM_SEARCH_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace kvrm {

struct Beam {
  std::vector<int32_t> tokens;  // generated so far (an ended beam's last is its EOS)
  double cum_logprob = 0;       // the sum of its tokens' logprobs
  bool ended = false;           // it ended with an end-of-sequence token
};

struct BeamSearchConfig {
  int32_t width = 1;          // beams kept each step; the answers
  double length_penalty = 1;  // score = cum_logprob / length^length_penalty
  int32_t prompt_tokens = 0;  // counted in the length, as vLLM counts them
  std::vector<int32_t> eos_ids;
  bool ignore_eos = false;  // an EOS is then a token like any other
};

// vLLM's beam score: cum_logprob / L^length_penalty, L the prompt's and the beam's tokens (an
// ended beam's EOS not counted).
double BeamScore(const Beam& beam, const BeamSearchConfig& config);

// One step. `candidates[b]` are live beam b's scored next tokens (token, logprob), the most
// likely first. Every beam extended by each of its candidates: those whose token is an EOS
// (unless ignore_eos) end and join `completed`, which keeps only its best `width` (an ended
// beam's score is final, so no other can be in the answer); of the others the best `width` by
// score are the next live beams (ties: the earlier beam, then the earlier candidate).
std::vector<Beam> BeamStep(const std::vector<Beam>& beams,
                           const std::vector<std::vector<std::pair<int32_t, float>>>& candidates,
                           const BeamSearchConfig& config, std::vector<Beam>* completed);

// The answer: the best `width` of the ended and the live beams together, best first.
std::vector<Beam> BestBeams(std::vector<Beam> completed, std::vector<Beam> live,
                            const BeamSearchConfig& config);

}  // namespace kvrm

#endif  // KVRM_SERVER_BEAM_SEARCH_H_
