#include "tools/modelgen/pretokenizer.h"

#include <oniguruma.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kvrm::modelgen {

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create() {
  static const int init = [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    return onig_initialize(encodings, 1);
  }();
  if (init != ONIG_NORMAL) return absl::InternalError("onig_initialize failed");
  OnigRegex regex = nullptr;
  OnigErrorInfo error_info;
  const auto* pattern = reinterpret_cast<const OnigUChar*>(kLlama3SplitPattern.data());
  const int rc = onig_new(&regex, pattern, pattern + kLlama3SplitPattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &error_info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &error_info);
    return absl::InternalError(
        absl::StrCat("bad pre-tokenizer pattern: ", reinterpret_cast<char*>(message)));
  }
  std::unique_ptr<PreTokenizer> p(new PreTokenizer(regex));
  p->region_ = onig_region_new();
  return p;
}

PreTokenizer::~PreTokenizer() {
  onig_region_free(static_cast<OnigRegion*>(region_), 1);
  onig_free(static_cast<OnigRegex>(regex_));
}

bool PreTokenizer::NextMatch(std::string_view text, size_t pos, size_t* begin,
                             size_t* end) const {
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* str_end = str + text.size();
  auto* region = static_cast<OnigRegion*>(region_);
  const int r = onig_search(static_cast<OnigRegex>(regex_), str, str_end, str + pos, str_end,
                            region, ONIG_OPTION_NONE);
  if (r < 0) return false;
  *begin = static_cast<size_t>(region->beg[0]);
  *end = static_cast<size_t>(region->end[0]);
  return *end > *begin;  // the pattern cannot match empty; guard against looping anyway
}

void PreTokenizer::Count(std::string_view text, WordCounts* counts) const {
  absl::flat_hash_map<std::string_view, int64_t> local;
  Split(text, [&](std::string_view piece) { ++local[piece]; });
  counts->reserve(counts->size() + local.size());
  for (const auto& [piece, n] : local) counts->emplace_back(std::string(piece), n);
}

}  // namespace kvrm::modelgen
