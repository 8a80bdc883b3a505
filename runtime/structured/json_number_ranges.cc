#include "runtime/structured/json_number_ranges.h"

#include <limits>
#include <utility>
#include <vector>

#include "runtime/structured/regex_builders.h"

namespace kvrm::structured {
namespace {

Regex L(const char* text) { return Literal(text); }

// No upper bound, for UnsignedRange (magnitudes here never exceed 2^63).
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// Decimal numerals (no leading zeros) of the integers in [a, b]; b == kUnbounded: no bound.
Regex UnsignedRange(uint64_t a, uint64_t b) {
  if (a > b) return Nothing();
  const bool bounded = b != kUnbounded;
  const std::string low = std::to_string(a);
  const std::string high = bounded ? std::to_string(b) : std::string();
  const size_t last = bounded ? high.size() : low.size();
  std::vector<Regex> options;
  for (size_t len = low.size(); len <= last; ++len) {
    const std::string from = len == low.size() ? low : "1" + std::string(len - 1, '0');
    const std::string to = bounded && len == last ? high : std::string(len, '9');
    options.push_back(SameLengthNumerals(from, to));
  }
  if (!bounded) {
    options.push_back(
        Concat({Range('1', '9'), Repeat(Digit(), static_cast<int32_t>(low.size()), -1)}));
  }
  return Alt(std::move(options));
}

// |v| for negative v, INT64_MIN included.
uint64_t Magnitude(int64_t v) { return static_cast<uint64_t>(-(v + 1)) + 1; }

struct MagnitudeBound {
  uint64_t value = 0;
  bool exclusive = false;
};

// Non-negative decimals I(.F)? (no exponent) with a <= m <= b, each bound inclusive or exclusive,
// a and b integers: cut by the integer part.
Regex DecimalMagnitude(MagnitudeBound a, std::optional<MagnitudeBound> b) {
  const Regex any_fraction = Optional(Concat({L("."), Plus(Digit())}));
  const Regex zero_fraction = Optional(Concat({L("."), Plus(L("0"))}));
  const Regex nonzero_fraction = Concat({L("."), Star(Digit()), Range('1', '9'), Star(Digit())});
  const Regex at_a = Literal(std::to_string(a.value));
  if (b) {
    if (a.value > b->value) return Nothing();
    if (a.value == b->value) {
      return !a.exclusive && !b->exclusive ? Concat({at_a, zero_fraction}) : Nothing();
    }
  }
  std::vector<Regex> options = {Concat({at_a, a.exclusive ? nonzero_fraction : any_fraction})};
  if (!b) {
    options.push_back(Concat({UnsignedRange(a.value + 1, kUnbounded), any_fraction}));
  } else {
    if (a.value + 1 <= b->value - 1) {
      options.push_back(Concat({UnsignedRange(a.value + 1, b->value - 1), any_fraction}));
    }
    if (!b->exclusive) {
      options.push_back(Concat({Literal(std::to_string(b->value)), zero_fraction}));
    }
  }
  return Alt(std::move(options));
}

}  // namespace

Regex JsonNumber() {
  static const Regex* const kNumberRegex = new Regex([] {
    const Regex integer = Alt({L("0"), Concat({Range('1', '9'), Star(Digit())})});
    const Regex fraction = Concat({L("."), Plus(Digit())});
    const Regex exponent = Concat({Chars("eE"), Optional(Chars("+-")), Plus(Digit())});
    return Concat({Optional(L("-")), integer, Optional(fraction), Optional(exponent)});
  }());
  return *kNumberRegex;
}

// Equal leading digit; else the low edge, the full middle, the high edge.
Regex SameLengthNumerals(const std::string& x, const std::string& y) {
  if (x.empty()) return Empty();
  const std::string x_rest = x.substr(1);
  const std::string y_rest = y.substr(1);
  if (x[0] == y[0]) return Concat({Literal(x.substr(0, 1)), SameLengthNumerals(x_rest, y_rest)});
  const size_t n = x_rest.size();
  const bool low_full = x_rest == std::string(n, '0');
  const bool high_full = y_rest == std::string(n, '9');
  const char mid_lo = low_full ? x[0] : static_cast<char>(x[0] + 1);
  const char mid_hi = high_full ? y[0] : static_cast<char>(y[0] - 1);
  std::vector<Regex> options;
  if (!low_full) {
    options.push_back(
        Concat({Literal(x.substr(0, 1)), SameLengthNumerals(x_rest, std::string(n, '9'))}));
  }
  if (mid_lo <= mid_hi) {
    options.push_back(Concat({Range(mid_lo, mid_hi), Times(Digit(), static_cast<int32_t>(n))}));
  }
  if (!high_full) {
    options.push_back(
        Concat({Literal(y.substr(0, 1)), SameLengthNumerals(std::string(n, '0'), y_rest)}));
  }
  return Alt(std::move(options));
}

Regex IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return Nothing();
  std::vector<Regex> options;
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    options.push_back(UnsignedRange(a, hi ? static_cast<uint64_t>(*hi) : kUnbounded));
  }
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? Magnitude(*hi) : 1;
    const uint64_t m_hi = lo ? Magnitude(*lo) : kUnbounded;
    options.push_back(Concat({L("-"), UnsignedRange(m_lo, m_hi)}));
  }
  return Alt(std::move(options));
}

// Non-negative ones by magnitude, negative ones as "-" and a positive magnitude.
Regex BoundedNumber(std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  std::vector<Regex> options;
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const MagnitudeBound a = lo && lo->value >= 0
                                 ? MagnitudeBound{static_cast<uint64_t>(lo->value), lo->exclusive}
                                 : MagnitudeBound{0, false};
    std::optional<MagnitudeBound> b;
    if (hi) b = MagnitudeBound{static_cast<uint64_t>(hi->value), hi->exclusive};
    options.push_back(DecimalMagnitude(a, b));
  }
  if (!lo || lo->value < 0) {
    const MagnitudeBound a = hi && hi->value < 0
                                 ? MagnitudeBound{Magnitude(hi->value), hi->exclusive}
                                 : MagnitudeBound{0, true};
    std::optional<MagnitudeBound> b;
    if (lo) b = MagnitudeBound{Magnitude(lo->value), lo->exclusive};
    options.push_back(Concat({L("-"), DecimalMagnitude(a, b)}));
  }
  return Alt(std::move(options));
}

}  // namespace kvrm::structured
