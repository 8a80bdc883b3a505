#include "runtime/structured/json_schema_scalars.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/structured/json_number_ranges.h"
#include "runtime/structured/json_string_formats.h"
#include "runtime/structured/json_strings.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured::json_schema_internal {
namespace {

// The string keywords of every schema in force, combined: the tightest lengths, the one pattern,
// the first format.
struct StringKeywords {
  uint64_t min_length = 0;
  std::optional<uint64_t> max_length;
  std::string min_pointer;
  const OJson* pattern = nullptr;
  std::string pattern_pointer;
  const std::string* format = nullptr;
};

absl::StatusOr<StringKeywords> ReadStringKeywords(const Conj& conj) {
  StringKeywords k;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    const OJson& s = *m.schema;
    if (auto it = s.find("minLength"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minLength")));
      if (n > k.min_length) {
        k.min_length = n;
        k.min_pointer = Child(m.pointer, "minLength");
      }
    }
    if (auto it = s.find("maxLength"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxLength")));
      k.max_length = std::min(n, k.max_length.value_or(n));
    }
    if (auto it = s.find("pattern"); it != s.end()) {
      const std::string pointer = Child(m.pointer, "pattern");
      if (!it->is_string()) return SchemaError(pointer, "must be a string");
      if (k.pattern != nullptr && *k.pattern != *it) {
        return SchemaError(pointer, "two different patterns on one string are not supported");
      }
      k.pattern = &*it;
      k.pattern_pointer = pointer;
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string() && k.format == nullptr) {
      k.format = &it->get_ref<const std::string&>();
    }
  }
  return k;
}

// Integer bounds, inclusive, as the keywords give them (possibly beyond int64).
struct IntegerBounds {
  std::optional<__int128> lo, hi;
  std::string lo_pointer, hi_pointer;
};

// Draft 4's "exclusiveMinimum": false says the bound is inclusive: no constraint of its own.
bool IsDraft4False(const OJson& v) { return v.is_boolean() && !v.get<bool>(); }

// Calls use(keyword, pointer, value) for each numeric bound keyword in force, in the
// conjunction's order (draft 4's "exclusiveMinimum": false is no bound); an error stops it.
template <typename F>
absl::Status ForEachNumericBound(const Conj& conj, F use) {
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (const char* keyword : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      auto it = m.schema->find(keyword);
      if (it == m.schema->end() || IsDraft4False(*it)) continue;
      const std::string pointer = Child(m.pointer, keyword);
      ASSIGN_OR_RETURN(const JsonNumberValue n, ReadNumber(*it, pointer));
      RETURN_IF_ERROR(use(std::string_view(keyword), pointer, n));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<IntegerBounds> ReadIntegerBounds(const Conj& conj) {
  IntegerBounds b;
  RETURN_IF_ERROR(ForEachNumericBound(
      conj, [&](std::string_view k, const std::string& pointer, const JsonNumberValue& n) {
        if (k == "minimum" || k == "exclusiveMinimum") {
          const __int128 v = k == "minimum" ? CeilOf(n) : FloorOf(n) + 1;
          if (!b.lo || v > *b.lo) {
            b.lo = v;
            b.lo_pointer = pointer;
          }
        } else {
          const __int128 v = k == "maximum" ? FloorOf(n) : CeilOf(n) - 1;
          if (!b.hi || v < *b.hi) {
            b.hi = v;
            b.hi_pointer = pointer;
          }
        }
        return absl::OkStatus();
      }));
  return b;
}

}  // namespace

absl::StatusOr<Regex> StringValue(const Conj& conj, int32_t max_count) {
  ASSIGN_OR_RETURN(const StringKeywords k, ReadStringKeywords(conj));
  if (k.max_length && k.min_length > *k.max_length) return Nothing();
  if (k.pattern != nullptr) {
    if (k.min_length > 0 || k.max_length) {
      return SchemaError(k.pattern_pointer,
                         "pattern together with minLength/maxLength is not supported");
    }
    const std::string& text = k.pattern->get_ref<const std::string&>();
    absl::StatusOr<Regex> tree = ParseRegex(text);
    if (!tree.ok()) return SchemaError(k.pattern_pointer, tree.status().message());
    // "format" is an annotation; the pattern is what the string must match.
    return Quote(PatternContent(*tree));
  }
  if (k.format != nullptr) {
    // A format is kept where the lengths cannot cut into it; otherwise the lengths (assertions)
    // win over the format (an annotation by default).
    std::optional<StringFormat> f = FindStringFormat(*k.format);
    if (f && f->min_length >= k.min_length && (!k.max_length || f->max_length <= *k.max_length)) {
      return Quote(f->regex);
    }
  }
  if (k.min_length > static_cast<uint64_t>(max_count)) {
    return SchemaError(k.min_pointer,
                       absl::StrCat("minLength above ", max_count, " is not supported"));
  }
  const int32_t max =
      k.max_length ? static_cast<int32_t>(std::min<uint64_t>(*k.max_length, max_count)) : -1;
  return Quote(Repeat(JsonStringChar(), static_cast<int32_t>(k.min_length), max));
}

absl::StatusOr<Regex> IntegerValue(const Conj& conj) {
  ASSIGN_OR_RETURN(const IntegerBounds b, ReadIntegerBounds(conj));
  constexpr __int128 kMin = std::numeric_limits<int64_t>::min();
  constexpr __int128 kMax = std::numeric_limits<int64_t>::max();
  if (b.lo && b.hi && *b.lo > *b.hi) return Nothing();
  if (b.lo && *b.lo > kMax) {
    return SchemaError(b.lo_pointer, "a lower bound above the 64-bit range is not supported");
  }
  if (b.hi && *b.hi < kMin) {
    return SchemaError(b.hi_pointer, "an upper bound below the 64-bit range is not supported");
  }
  // Bounds beyond the 64-bit range are narrowed to it: every integer generated still satisfies
  // them.
  std::optional<int64_t> lo64, hi64;
  if (b.lo) lo64 = static_cast<int64_t>(std::max(*b.lo, kMin));
  if (b.hi) hi64 = static_cast<int64_t>(std::min(*b.hi, kMax));
  return IntegerRange(lo64, hi64);
}

absl::StatusOr<Regex> NumberValue(const Conj& conj) {
  std::optional<NumberBound> lo, hi;
  RETURN_IF_ERROR(ForEachNumericBound(
      conj, [&](std::string_view k, const std::string& pointer, const JsonNumberValue& n) {
        if (!n.integral || n.integer < std::numeric_limits<int64_t>::min() ||
            n.integer > std::numeric_limits<int64_t>::max()) {
          return SchemaError(pointer,
                             "bounds on numbers are only supported when they are integers within "
                             "64 bits (use \"type\": \"integer\" or an integer bound)");
        }
        const NumberBound b{static_cast<int64_t>(n.integer),
                            k == "exclusiveMinimum" || k == "exclusiveMaximum"};
        if (k == "minimum" || k == "exclusiveMinimum") {
          if (!lo || b.value > lo->value || (b.value == lo->value && b.exclusive)) lo = b;
        } else {
          if (!hi || b.value < hi->value || (b.value == hi->value && b.exclusive)) hi = b;
        }
        return absl::OkStatus();
      }));
  if (!lo && !hi) return JsonNumber();
  return BoundedNumber(lo, hi);
}

}  // namespace kvrm::structured::json_schema_internal
