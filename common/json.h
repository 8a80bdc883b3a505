// JSON parsing for untrusted files (config.json, tokenizer.json, index files, traces).
//
// Wraps nlohmann::json with a nesting-depth bound checked before parsing (the parser recurses),
// and typed accessors whose errors name the file and the key path.
#ifndef KVRM_COMMON_JSON_H_
#define KVRM_COMMON_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvrm {

using Json = nlohmann::json;
// Keeps object keys in the order they were written (JSON Schemas, tool-call arguments).
using OrderedJson = nlohmann::ordered_json;

inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; `what` names the source in errors ("config.json"). Fails with
// INVALID_ARGUMENT on malformed JSON or nesting deeper than `max_depth`.
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what,
                               int max_depth = kMaxJsonDepth);

// As ParseJson, keeping object keys in document order.
absl::StatusOr<OrderedJson> ParseOrderedJson(std::string_view text, std::string_view what,
                                             int max_depth = kMaxJsonDepth);

// Reads and parses a file; errors name the path.
absl::StatusOr<Json> ReadJsonFile(const std::string& path, int max_depth = kMaxJsonDepth);

// Whole-file read; NOT_FOUND when missing, with the path in the message.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Whole or not at all: `text` goes to path + ".tmp", which is then renamed over `path`, so a
// writer killed part way never leaves a truncated file. INTERNAL naming the path on failure.
absl::Status WriteFileAtomically(const std::string& path, std::string_view text);

}  // namespace kvrm

#endif  // KVRM_COMMON_JSON_H_
