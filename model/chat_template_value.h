// Values of the chat-template (Jinja2 subset) evaluator: Python-like none, bool, int, float,
// str, list, dict (insertion-ordered, string keys), Jinja's namespace and Undefined, and
// callables (builtins, macros). Internal to the chat_template library; see chat_template.h.
//
// Lists and dicts are immutable and shared (the template sandbox never mutates them); a
// namespace is the one mutable object and lives in its render's arena, so a value never
// outlives the render that made it. Every container records its nesting depth, which the
// evaluator bounds, so the recursive functions here (str, repr, tojson, ==, <) are bounded too.
#ifndef KVRM_MODEL_CHAT_TEMPLATE_VALUE_H_
#define KVRM_MODEL_CHAT_TEMPLATE_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvrm::jinja {

// This Abseil's string_view is its own type (ABSL_OPTION_USE_STD_STRING_VIEW is 0), so
// std::string_view arguments go through these.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
template <typename T>
const T& CatArg(const T& v) {
  return v;
}
inline absl::string_view CatArg(std::string_view v) { return AV(v); }
template <typename... T>
std::string Cat(const T&... v) {
  return absl::StrCat(CatArg(v)...);
}

class Value;

using Attrs = std::vector<std::pair<std::string, Value>>;

struct ListData {
  std::vector<Value> items;
  int depth = 1;  // 1 + the deepest item's depth
};

struct DictData {
  Attrs items;  // insertion order, unique keys
  int depth = 1;
};

// Jinja's namespace(): mutable attributes; owned by the render's arena.
struct Namespace {
  Attrs attrs;
};

// Jinja's default Undefined; `hint` names what was missing, for errors ("'x' is undefined").
struct Undefined {
  std::string hint;
};

// A builtin global (id chosen by the evaluator) or a macro (its AST node).
struct Callable {
  int builtin = -1;
  const void* macro = nullptr;
  std::string name;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value MakeUndefined(std::string hint) {
    return Value(std::in_place_type<Undefined>, Undefined{std::move(hint)});
  }
  static Value None() { return Value(std::in_place_type<std::nullptr_t>, nullptr); }
  static Value Bool(bool b) { return Value(std::in_place_type<bool>, b); }
  static Value Int(int64_t i) { return Value(std::in_place_type<int64_t>, i); }
  static Value Float(double d) { return Value(std::in_place_type<double>, d); }
  static Value Str(std::string s) { return Value(std::in_place_type<std::string>, std::move(s)); }
  static Value List(std::vector<Value> items);
  static Value Dict(Attrs items);  // keys must be unique (callers dedupe)
  static Value Ns(Namespace* ns) { return Value(std::in_place_type<Namespace*>, ns); }
  static Value Func(Callable c) { return Value(std::in_place_type<Callable>, std::move(c)); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python's Number
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Numeric value of a bool/int/float.
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const std::vector<Value>& as_list() const {
    return std::get<std::shared_ptr<const ListData>>(v_)->items;
  }
  const Attrs& as_dict() const { return std::get<std::shared_ptr<const DictData>>(v_)->items; }
  Namespace* as_namespace() const { return std::get<Namespace*>(v_); }
  const Callable& as_callable() const { return std::get<Callable>(v_); }

  // Container nesting depth: 0 for scalars (and namespaces, which are references).
  int depth() const;

 private:
  template <typename T, typename... A>
  explicit Value(std::in_place_type_t<T> type, A&&... args) : v_(type, std::forward<A>(args)...) {}

  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>, Namespace*,
               Callable>
      v_;
};

// Looks `key` up in an attribute list; nullptr when absent.
const Value* FindAttr(const Attrs& attrs, std::string_view key);
void SetAttr(Attrs& attrs, std::string key, Value value);

// Python type name, for errors: "str", "int", "list", "dict", "NoneType", "Undefined", ...
std::string_view TypeName(const Value& v);

// Python truthiness (Undefined is falsy).
bool Truthy(const Value& v);

// Python's str() (Undefined -> ""), appended to *out; fails (INVALID_ARGUMENT) when *out would
// grow past `limit` bytes.
absl::Status AppendStr(const Value& v, size_t limit, std::string* out);
// Python's repr().
absl::Status AppendRepr(const Value& v, size_t limit, std::string* out);

// Python float repr: "1.0", "0.1", "1e+16", "inf", "nan".
std::string FormatFloat(double d);

// Python ==. `budget`, when given, is decremented per value visited and per dict key probed;
// once it is negative the comparison stops early with an unspecified result (callers check).
bool Equals(const Value& a, const Value& b, int64_t* budget = nullptr);
// Python ordering (<0, 0, >0) for numbers, strings, lists; an error for other types (and when
// `budget` runs out, as for Equals).
absl::StatusOr<int> Compare(const Value& a, const Value& b, int64_t* budget = nullptr);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys), as transformers' tojson.
struct JsonOptions {
  std::optional<std::string> indent;  // nullopt: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
absl::Status AppendJson(const Value& v, const JsonOptions& options, size_t limit, std::string* out);

// UTF-8 helpers: code point boundaries (an invalid byte counts as one code point).
std::vector<std::string_view> CodePoints(std::string_view s);
size_t CodePointCount(std::string_view s);
// Python str.strip/lstrip/rstrip: `chars` nullopt strips Unicode whitespace (str.isspace).
std::string_view PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                         bool right);
// Python str.split(sep=None / sep, maxsplit); sep must not be empty.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit);
// ASCII-only case mapping (a documented gap: non-ASCII letters are left as they are).
std::string AsciiLower(std::string_view s);
std::string AsciiUpper(std::string_view s);
std::string PyCapitalize(std::string_view s);
std::string PyTitle(std::string_view s);

}  // namespace kvrm::jinja

#endif  // KVRM_MODEL_CHAT_TEMPLATE_VALUE_H_
