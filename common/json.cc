#include "common/json.h"

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvrm {
namespace {

// Maximum nesting of arrays/objects, skipping string contents. Linear, no recursion.
int NestingDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

template <typename J>
absl::StatusOr<J> ParseBounded(std::string_view text, std::string_view what, int max_depth) {
  if (NestingDepth(text) > max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": JSON nested deeper than ", max_depth, " levels"));
  }
  J j = J::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Re-parse with diagnostics off the hot path to report the byte offset.
    try {
      (void)J::parse(text.begin(), text.end());
    } catch (const typename J::exception& e) {
      // parse_error, and out_of_range for numbers beyond a double ("1e999"): every failure of
      // untrusted input must come back as a Status, never escape.
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": invalid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": invalid JSON"));
  }
  return j;
}

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what, int max_depth) {
  return ParseBounded<Json>(text, what, max_depth);
}

absl::StatusOr<OrderedJson> ParseOrderedJson(std::string_view text, std::string_view what,
                                             int max_depth) {
  return ParseBounded<OrderedJson>(text, what, max_depth);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ss.str();
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path, int max_depth) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseJson(*text, path, max_depth);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvrm
