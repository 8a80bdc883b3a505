// Jinja2-subset renderer for chat templates: the parser (chat_template_parser.cc) builds an AST;
// this is the tree-walking evaluator, with Python value semantics (chat_template_value.cc).
#include "model/chat_template.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/chat_template_parser.h"
#include "model/chat_template_value.h"

namespace kvrm {
namespace jinja {
namespace {

constexpr int kMaxValueDepth = ChatTemplate::kMaxParseDepth;
constexpr size_t kMaxStr = ChatTemplate::kMaxOutputBytes;

enum Builtin { kRaiseException, kNamespace, kStrftimeNow, kRange, kDict };
constexpr std::pair<std::string_view, Builtin> kBuiltins[] = {{"raise_exception", kRaiseException},
                                                              {"namespace", kNamespace},
                                                              {"strftime_now", kStrftimeNow},
                                                              {"range", kRange},
                                                              {"dict", kDict}};

std::vector<std::string_view> SplitChar(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t at; (at = s.find(sep, start)) != std::string_view::npos; start = at + 1) {
    parts.push_back(s.substr(start, at - start));
  }
  parts.push_back(s.substr(start));
  return parts;
}

// ---- evaluator --------------------------------------------------------------------------------

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Evaluator {
 public:
  // `empty_call_content`: an assistant turn with tool calls and no content gets content "" (as
  // vLLM gives it) instead of none (as transformers does).
  Evaluator(const ChatTemplateInputs& in, bool empty_call_content)
      : in_(in), empty_call_content_(empty_call_content) {}

  absl::StatusOr<std::string> Run(const Body& body) {
    std::vector<Value> messages;
    messages.reserve(in_.messages.size());
    for (size_t i = 0; i < in_.messages.size(); ++i) {
      ASSIGN_OR_RETURN(Value m, MessageValue(in_.messages[i], i));
      messages.push_back(std::move(m));
    }
    Scope& globals = scopes_.emplace_back();
    globals["messages"] = Value::List(std::move(messages));
    globals["add_generation_prompt"] = Value::Bool(in_.add_generation_prompt);
    globals["bos_token"] = Value::Str(in_.bos_token);
    globals["eos_token"] = Value::Str(in_.eos_token);
    // None without tools, as transformers passes them when none are given.
    globals["tools"] = Value::None();
    if (!in_.tools.empty()) {
      std::vector<Value> tools;
      for (size_t i = 0; i < in_.tools.size(); ++i) {
        ASSIGN_OR_RETURN(Value t, JsonValue(in_.tools[i], Cat("tools[", i, "]")));
        tools.push_back(std::move(t));
      }
      globals["tools"] = Value::List(std::move(tools));
    }
    globals["documents"] = Value::None();
    if (!in_.extra_variables.empty()) {
      ASSIGN_OR_RETURN(Value extra, JsonValue(in_.extra_variables, "extra variables"));
      if (!extra.is_dict()) return Err(0, "extra variables must be a JSON object");
      for (const auto& [name, value] : extra.as_dict()) {
        if (globals.contains(name)) {
          return Err(0, Cat("extra variable '", name, "' would replace a standard one"));
        }
        globals[name] = value;
      }
    }
    std::string out;
    out_ = &out;
    ASSIGN_OR_RETURN(Flow flow, Exec(body));
    (void)flow;
    return out;
  }

 private:
  using Scope = absl::flat_hash_map<std::string, Value>;

  // ---- inputs

  // JSON text (depth bounded before parsing) as a template value, object keys in order.
  absl::StatusOr<Value> JsonValue(std::string_view text, std::string_view what) {
    absl::StatusOr<OrderedJson> json = ParseOrderedJson(text, what);
    if (!json.ok()) return Err(0, std::string(json.status().message()));
    return FromJson(*json, what);
  }
  absl::StatusOr<Value> FromJson(const OrderedJson& j, std::string_view what) {
    switch (j.type()) {
      case OrderedJson::value_t::null: return Value::None();
      case OrderedJson::value_t::boolean: return Value::Bool(j.get<bool>());
      case OrderedJson::value_t::number_integer: return Value::Int(j.get<int64_t>());
      case OrderedJson::value_t::number_unsigned: {
        const uint64_t u = j.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Value::Float(static_cast<double>(u));
        }
        return Value::Int(static_cast<int64_t>(u));
      }
      case OrderedJson::value_t::number_float: return Value::Float(j.get<double>());
      case OrderedJson::value_t::string: {
        std::string str = j.get<std::string>();
        RETURN_IF_ERROR(Charge(0, static_cast<int64_t>(str.size())));
        return Value::Str(std::move(str));
      }
      case OrderedJson::value_t::array: {
        std::vector<Value> items;
        items.reserve(j.size());
        for (const OrderedJson& item : j) {
          ASSIGN_OR_RETURN(Value v, FromJson(item, what));
          items.push_back(std::move(v));
        }
        return MakeList(0, std::move(items));
      }
      case OrderedJson::value_t::object: {
        Attrs items;
        items.reserve(j.size());
        for (const auto& [key, item] : j.items()) {
          ASSIGN_OR_RETURN(Value v, FromJson(item, what));
          SetAttr(items, key, std::move(v));  // parsing keeps one entry per key already
        }
        return MakeDict(0, std::move(items));
      }
      default: return Err(0, Cat(what, ": unsupported JSON value"));
    }
  }
  // A message as transformers / vLLM hand it to the template.
  absl::StatusOr<Value> MessageValue(const ChatMessage& m, size_t index) {
    Attrs d{{"role", Value::Str(m.role)},
            {"content", m.content.empty() && !m.tool_calls.empty() && !empty_call_content_
                            ? Value::None()
                            : Value::Str(m.content)}};
    if (!m.tool_calls.empty()) {
      std::vector<Value> calls;
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        const ChatToolCall& c = m.tool_calls[j];
        Value arguments = Value::Dict({});
        if (!c.arguments.empty()) {
          ASSIGN_OR_RETURN(arguments,
                           JsonValue(c.arguments, Cat("messages[", index, "].tool_calls[", j,
                                                      "].arguments")));
        }
        Attrs call;
        if (!c.id.empty()) call.emplace_back("id", Value::Str(c.id));
        call.emplace_back("type", Value::Str("function"));
        call.emplace_back("function", Value::Dict({{"name", Value::Str(c.name)},
                                                   {"arguments", std::move(arguments)}}));
        calls.push_back(Value::Dict(std::move(call)));
      }
      d.emplace_back("tool_calls", Value::List(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) d.emplace_back("tool_call_id", Value::Str(m.tool_call_id));
    if (!m.name.empty()) d.emplace_back("name", Value::Str(m.name));
    if (!m.reasoning_content.empty()) {
      d.emplace_back("reasoning_content", Value::Str(m.reasoning_content));
      d.emplace_back("thinking", Value::Str(m.reasoning_content));
    }
    return Value::Dict(std::move(d));
  }

  // ---- errors and bounds

  // Line 0: an input (tools, tool-call arguments, extra variables), not a template line.
  static absl::Status Err(int line, std::string_view msg) {
    if (line <= 0) return absl::InvalidArgumentError(Cat(kErrorPrefix, msg));
    return absl::InvalidArgumentError(Cat(kErrorPrefix, "line ", line, ": ", msg));
  }
  static absl::Status At(int line, const absl::Status& s) {
    return s.ok() ? s : Err(line, std::string(s.message()));
  }
  static absl::Status UndefinedError(int line, const Value& v) {
    return Err(line, v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }
  absl::Status Charge(int line, int64_t units) {
    budget_ -= units;
    if (budget_ < 0) return Err(line, "evaluation exceeds the work limit");
    return absl::OkStatus();
  }
  // Containers are charged by the bytes they hold (an item is at least a Value).
  absl::StatusOr<Value> MakeList(int line, std::vector<Value> items) {
    RETURN_IF_ERROR(Charge(line, static_cast<int64_t>((items.size() + 1) * sizeof(Value))));
    Value v = Value::List(std::move(items));
    if (v.depth() > kMaxValueDepth) return Err(line, "value nested too deep");
    return v;
  }
  absl::StatusOr<Value> MakeDict(int line, Attrs items, bool charge = true) {
    if (charge) {
      RETURN_IF_ERROR(
          Charge(line, static_cast<int64_t>((items.size() + 1) * sizeof(Attrs::value_type))));
    }
    Value v = Value::Dict(std::move(items));
    if (v.depth() > kMaxValueDepth) return Err(line, "value nested too deep");
    return v;
  }
  absl::Status Emit(int line, std::string_view s) {
    if (out_->size() + s.size() > kMaxStr) {
      return Err(line, Cat("output exceeds ", kMaxStr, " bytes"));
    }
    RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(s.size())));
    out_->append(s);
    return absl::OkStatus();
  }
  // A string's characters (code points), charged: it allocates per character.
  absl::StatusOr<std::vector<std::string_view>> Chars(int line, std::string_view s) {
    RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(s.size() * sizeof(std::string_view))));
    return CodePoints(s);
  }
  static bool IsAscii(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
  }
  absl::StatusOr<std::string> ToStr(int line, const Value& v) {
    if (v.is_string()) return v.as_string();
    std::string s;
    RETURN_IF_ERROR(At(line, AppendStr(v, kMaxStr, &s)));
    return s;
  }
  absl::StatusOr<bool> Eq(int line, const Value& a, const Value& b) {
    const bool eq = Equals(a, b, &budget_);
    if (budget_ < 0) return Err(line, "evaluation exceeds the work limit");
    return eq;
  }

  // ---- statements

  absl::StatusOr<Flow> Exec(const Body& body) {
    for (const auto& s : body) {
      ASSIGN_OR_RETURN(Flow flow, ExecStmt(*s));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecStmt(const Stmt& s) {
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxEvalDepth) return Err(s.line, "template nesting too deep");
    switch (s.kind) {
      case StmtKind::kText:
        RETURN_IF_ERROR(Emit(s.line, s.text));
        break;
      case StmtKind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (v.is_string()) {
          RETURN_IF_ERROR(Emit(s.line, v.as_string()));
        } else {
          ASSIGN_OR_RETURN(std::string text, ToStr(s.line, v));
          RETURN_IF_ERROR(Emit(s.line, text));
        }
        break;
      }
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (cond != nullptr) {
            ASSIGN_OR_RETURN(Value c, Eval(*cond));
            if (!Truthy(c)) continue;
          }
          return Exec(body);
        }
        break;
      case StmtKind::kFor:
        return ExecFor(s);
      case StmtKind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        RETURN_IF_ERROR(Assign(s, std::move(v)));
        break;
      }
      case StmtKind::kSetAttr: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        Value ns = Lookup(s.targets[0]);
        if (!ns.is_namespace()) {
          return Err(s.line,
                     Cat("cannot assign attribute on non-namespace object '", s.targets[0], "'"));
        }
        SetAttr(ns.as_namespace()->attrs, s.text, std::move(v));
        break;
      }
      case StmtKind::kSetBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(s.body));
        RETURN_IF_ERROR(Assign(s, Value::Str(std::move(text))));
        break;
      }
      case StmtKind::kMacro: {
        Callable c;
        c.macro = &s;
        c.name = s.text;
        scopes_.back()[s.text] = Value::Func(std::move(c));
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kBlock:
        return Exec(s.body);
      case StmtKind::kFilterBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(s.body));
        scopes_.emplace_back()[kFilterBlockOperand] = Value::Str(std::move(text));
        absl::StatusOr<Value> v = Eval(*s.expr);
        scopes_.pop_back();
        if (!v.ok()) return v.status();
        ASSIGN_OR_RETURN(std::string out, ToStr(s.line, *v));
        RETURN_IF_ERROR(Emit(s.line, out));
        break;
      }
    }
    return Flow::kNormal;
  }

  absl::Status Assign(const Stmt& s, Value v) {
    if (!s.unpack) {
      scopes_.back()[s.targets[0]] = std::move(v);
      return absl::OkStatus();
    }
    if (!v.is_list() || v.as_list().size() != s.targets.size()) {
      return Err(s.line, Cat("cannot unpack ", TypeName(v), " into ", s.targets.size(), " names"));
    }
    for (size_t i = 0; i < s.targets.size(); ++i) scopes_.back()[s.targets[i]] = v.as_list()[i];
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Capture(const Body& body) {
    std::string buffer;
    std::string* saved = out_;
    out_ = &buffer;
    absl::StatusOr<Flow> flow = Exec(body);
    out_ = saved;
    if (!flow.ok()) return flow.status();
    return buffer;
  }

  absl::Status CountIteration(int line) {
    if (++iterations_ > ChatTemplate::kMaxLoopIterations) {
      return Err(line, Cat("more than ", ChatTemplate::kMaxLoopIterations, " loop iterations"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s) {
    ASSIGN_OR_RETURN(Value seq_value, Eval(*s.expr));
    std::vector<Value> storage;
    ASSIGN_OR_RETURN(const std::vector<Value>* seq, Iter(s.line, seq_value, &storage));
    std::vector<const Value*> items;
    for (const Value& item : *seq) {
      if (s.filter != nullptr) {
        RETURN_IF_ERROR(CountIteration(s.line));
        scopes_.emplace_back();
        RETURN_IF_ERROR(Assign(s, item));
        absl::StatusOr<Value> keep = Eval(*s.filter);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (!Truthy(*keep)) continue;
      }
      items.push_back(&item);
    }
    if (items.empty()) return Exec(s.else_body);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(CountIteration(s.line));
      scopes_.emplace_back();
      RETURN_IF_ERROR(Assign(s, *items[i]));
      Attrs loop = {{"index", Value::Int(i + 1)},    {"index0", Value::Int(i)},
                    {"revindex", Value::Int(n - i)}, {"revindex0", Value::Int(n - i - 1)},
                    {"first", Value::Bool(i == 0)},  {"last", Value::Bool(i == n - 1)},
                    {"length", Value::Int(n)},       {"depth", Value::Int(1)},
                    {"depth0", Value::Int(0)}};
      if (i > 0) loop.emplace_back("previtem", *items[i - 1]);
      if (i + 1 < n) loop.emplace_back("nextitem", *items[i + 1]);
      ASSIGN_OR_RETURN(Value loop_value, MakeDict(s.line, std::move(loop), /*charge=*/false));
      scopes_.back()["loop"] = std::move(loop_value);
      absl::StatusOr<Flow> flow = Exec(s.body);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // ---- expressions

  Value Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > macro_base_;) {
      auto it = scopes_[i].find(name);
      if (it != scopes_[i].end()) return it->second;
    }
    if (macro_base_ > 0) {
      auto it = scopes_[0].find(name);
      if (it != scopes_[0].end()) return it->second;
    }
    for (const auto& [builtin_name, id] : kBuiltins) {
      if (builtin_name == name) {
        Callable c;
        c.builtin = id;
        c.name = name;
        return Value::Func(std::move(c));
      }
    }
    return Value::MakeUndefined(Cat("'", name, "' is undefined"));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxEvalDepth) return Err(e.line, "template nesting too deep");
    ASSIGN_OR_RETURN(Value v, EvalInner(e));
    if (v.is_string()) {
      if (v.as_string().size() > kMaxStr) {
        return Err(e.line, Cat("string exceeds ", kMaxStr, " bytes"));
      }
      RETURN_IF_ERROR(Charge(e.line, static_cast<int64_t>(v.as_string().size())));
    }
    return v;
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e) {
    Args args;
    for (size_t i = 1; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.pos.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.kw.emplace_back(key, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    const int line = e.line;
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return Lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return MakeList(line, std::move(items));
      }
      case ExprKind::kDict: {
        Attrs items;
        absl::flat_hash_map<std::string, size_t> index;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          if (!key.is_string()) return Err(line, "dict keys must be strings");
          ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
          auto [it, inserted] = index.emplace(key.as_string(), items.size());
          if (inserted) {
            items.emplace_back(key.as_string(), std::move(value));
          } else {
            items[it->second].second = std::move(value);
          }
        }
        return MakeDict(line, std::move(items));
      }
      case ExprKind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(line, obj, e.name);
      }
      case ExprKind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(line, obj, key);
      }
      case ExprKind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value parts[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1] != nullptr) {
            ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1]));
          }
        }
        return Slice(line, obj, parts[0], parts[1], parts[2]);
      }
      case ExprKind::kCall:
        return EvalCall(e);
      case ExprKind::kFilter: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Args args, EvalArgs(e));
        return Filter(line, e.name, v, args);
      }
      case ExprKind::kTest: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Args args, EvalArgs(e));
        ASSIGN_OR_RETURN(bool r, Test(line, e.name, v, args));
        return Value::Bool(r != e.negated);
      }
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_undefined()) return UndefinedError(line, v);
        if (!v.is_number()) {
          return Err(line, Cat("bad operand type for unary ", e.kind == ExprKind::kNeg ? "-" : "+",
                               ": '", TypeName(v), "'"));
        }
        if (v.is_float()) {
          return Value::Float(e.kind == ExprKind::kNeg ? -v.as_float() : v.as_float());
        }
        const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
        if (e.kind == ExprKind::kPos) return Value::Int(x);
        if (x == std::numeric_limits<int64_t>::min()) return Err(line, "integer overflow");
        return Value::Int(-x);
      }
      case ExprKind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!Truthy(v));
      }
      case ExprKind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return Binary(line, e.name, a, b);
      }
      case ExprKind::kConcat: {
        std::string s;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a));
          RETURN_IF_ERROR(At(line, AppendStr(v, kMaxStr, &s)));
        }
        return Value::Str(std::move(s));
      }
      case ExprKind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          ASSIGN_OR_RETURN(bool r, CompareOp(line, e.ops[i], left, right));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (Truthy(a) == (e.kind == ExprKind::kOr)) return a;
        return Eval(*e.args[1]);
      }
      case ExprKind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (Truthy(c)) return Eval(*e.args[0]);
        if (e.args[2] != nullptr) return Eval(*e.args[2]);
        return Value::MakeUndefined(
            "the inline if-expression evaluated to false and no else "
            "section was defined");
      }
    }
    return Err(line, "unknown expression");
  }

  absl::StatusOr<bool> CompareOp(int line, std::string_view op, const Value& a, const Value& b) {
    if (op == "==" || op == "!=") {
      ASSIGN_OR_RETURN(bool eq, Eq(line, a, b));
      return eq == (op == "==");
    }
    if (op == "in" || op == "not in") {
      ASSIGN_OR_RETURN(bool in, ContainsValue(line, b, a));
      return in == (op == "in");
    }
    absl::StatusOr<int> c = Compare(a, b, &budget_);
    if (!c.ok()) {
      if (a.is_undefined()) return UndefinedError(line, a);
      if (b.is_undefined()) return UndefinedError(line, b);
      return At(line, c.status());
    }
    if (op == "<") return *c < 0;
    if (op == "<=") return *c <= 0;
    if (op == ">") return *c > 0;
    return *c >= 0;
  }

  absl::StatusOr<bool> ContainsValue(int line, const Value& container, const Value& item) {
    switch (container.kind()) {
      case Value::Kind::kString:
        if (!item.is_string()) {
          return Err(line,
                     Cat("'in <string>' requires string as left operand, not ", TypeName(item)));
        }
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& v : container.as_list()) {
          ASSIGN_OR_RETURN(bool eq, Eq(line, v, item));
          if (eq) return true;
        }
        return false;
      case Value::Kind::kDict:
        RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(container.as_dict().size())));
        return item.is_string() && FindAttr(container.as_dict(), item.as_string()) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        return Err(line, Cat("argument of type '", TypeName(container), "' is not iterable"));
    }
  }

  // The items a for loop (or a filter) visits: a list's own items, or `storage` filled with a
  // dict's keys or a string's characters; undefined iterates as empty.
  absl::StatusOr<const std::vector<Value>*> Iter(int line, const Value& v,
                                                 std::vector<Value>* storage) {
    switch (v.kind()) {
      case Value::Kind::kList:
        RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(v.as_list().size())));
        return &v.as_list();
      case Value::Kind::kDict:
        for (const auto& kv : v.as_dict()) storage->push_back(Value::Str(kv.first));
        break;
      case Value::Kind::kString: {
        ASSIGN_OR_RETURN(std::vector<std::string_view> chars, Chars(line, v.as_string()));
        for (std::string_view c : chars) storage->push_back(Value::Str(std::string(c)));
        break;
      }
      case Value::Kind::kUndefined:
        break;
      default:
        return Err(line, Cat("'", TypeName(v), "' object is not iterable"));
    }
    RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(storage->size() * sizeof(Value))));
    return storage;
  }

  absl::StatusOr<Value> GetAttr(int line, const Value& obj, std::string_view name) {
    if (obj.is_dict()) {
      RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(obj.as_dict().size())));
      if (const Value* v = FindAttr(obj.as_dict(), name)) return *v;
    } else if (obj.is_namespace()) {
      if (const Value* v = FindAttr(obj.as_namespace()->attrs, name)) return *v;
    } else if (obj.is_undefined()) {
      return obj;  // lenient: an attribute of undefined is undefined
    }
    return Value::MakeUndefined(Cat("'", TypeName(obj), " object' has no attribute '", name, "'"));
  }

  absl::StatusOr<Value> GetItem(int line, const Value& obj, const Value& key) {
    if (key.is_string() && !obj.is_string()) return GetAttr(line, obj, key.as_string());
    if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
      int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
      if (obj.is_list()) {
        const auto& items = obj.as_list();
        const int64_t n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[i];
      } else if (IsAscii(obj.as_string())) {
        const int64_t n = static_cast<int64_t>(obj.as_string().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::Str(obj.as_string().substr(i, 1));
      } else {
        ASSIGN_OR_RETURN(std::vector<std::string_view> chars, Chars(line, obj.as_string()));
        const int64_t n = static_cast<int64_t>(chars.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::Str(std::string(chars[i]));
      }
      return Value::MakeUndefined(Cat(TypeName(obj), " index out of range"));
    }
    if (obj.is_undefined()) return obj;
    std::string key_repr;
    (void)AppendRepr(key, 256, &key_repr);
    return Value::MakeUndefined(Cat("'", TypeName(obj), " object' has no item ", key_repr));
  }

  absl::StatusOr<Value> Slice(int line, const Value& obj, const Value& start_v, const Value& stop_v,
                              const Value& step_v) {
    if (obj.is_undefined()) return obj;
    if (!obj.is_list() && !obj.is_string()) {
      return Err(line, Cat("'", TypeName(obj), "' object is not subscriptable"));
    }
    auto to_int = [&](const Value& v, int64_t* out) {
      if (v.is_int())
        *out = v.as_int();
      else if (v.is_bool())
        *out = v.as_bool();
      else
        return v.is_none();
      return true;
    };
    int64_t step = 1;
    if (!to_int(step_v, &step)) return Err(line, "slice indices must be integers or none");
    if (step == 0) return Err(line, "slice step cannot be zero");
    if (step == std::numeric_limits<int64_t>::min()) step = -std::numeric_limits<int64_t>::max();
    // A string is sliced by characters: bytes when it is ASCII, else its code points.
    std::vector<std::string_view> chars;
    const bool ascii = obj.is_string() && IsAscii(obj.as_string());
    if (obj.is_string() && !ascii) {
      ASSIGN_OR_RETURN(chars, Chars(line, obj.as_string()));
    }
    const int64_t len = obj.is_list() ? static_cast<int64_t>(obj.as_list().size())
                        : ascii       ? static_cast<int64_t>(obj.as_string().size())
                                      : static_cast<int64_t>(chars.size());
    const int64_t lower = step < 0 ? -1 : 0;
    const int64_t upper = step < 0 ? len - 1 : len;
    auto adjust = [&](const Value& v, int64_t dflt, int64_t* out) {
      if (v.is_none()) {
        *out = dflt;
        return true;
      }
      int64_t x;
      if (!to_int(v, &x)) return false;
      if (x < 0) {
        x = x < -len ? lower : std::max(x + len, lower);
      } else if (x > upper) {
        x = upper;
      }
      *out = x;
      return true;
    };
    int64_t start, stop;
    if (!adjust(start_v, step < 0 ? upper : lower, &start) ||
        !adjust(stop_v, step < 0 ? lower : upper, &stop)) {
      return Err(line, "slice indices must be integers or none");
    }
    int64_t count = 0;
    if (step > 0 && start < stop) count = (stop - start - 1) / step + 1;
    if (step < 0 && stop < start) count = (start - stop - 1) / (-step) + 1;
    if (obj.is_list()) {
      std::vector<Value> out;
      out.reserve(count);
      for (int64_t k = 0; k < count; ++k) out.push_back(obj.as_list()[start + k * step]);
      return MakeList(line, std::move(out));
    }
    std::string out;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t at = start + k * step;
      if (ascii) {
        out.push_back(obj.as_string()[at]);
      } else {
        out.append(chars[at]);
      }
    }
    return Value::Str(std::move(out));
  }

  absl::StatusOr<Value> Binary(int line, std::string_view op, const Value& a, const Value& b) {
    if (a.is_undefined()) return UndefinedError(line, a);
    if (b.is_undefined()) return UndefinedError(line, b);
    auto type_error = [&] {
      return Err(line, Cat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '",
                           TypeName(b), "'"));
    };
    auto ival = [](const Value& v) -> int64_t { return v.is_bool() ? v.as_bool() : v.as_int(); };
    const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
    const bool nums = a.is_number() && b.is_number();
    auto overflow = [line] { return Err(line, "integer overflow"); };
    int64_t r = 0;
    if (op == "+") {
      if (ints) {
        if (__builtin_add_overflow(ival(a), ival(b), &r)) return overflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        if (a.as_string().size() + b.as_string().size() > kMaxStr) {
          return Err(line, Cat("string exceeds ", kMaxStr, " bytes"));
        }
        return Value::Str(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list()) {
        std::vector<Value> items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return MakeList(line, std::move(items));
      }
      return type_error();
    }
    if (op == "-") {
      if (ints) {
        if (__builtin_sub_overflow(ival(a), ival(b), &r)) return overflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() - b.as_double());
      return type_error();
    }
    if (op == "*") {
      if (ints) {
        if (__builtin_mul_overflow(ival(a), ival(b), &r)) return overflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() * b.as_double());
      const Value* seq = (a.is_string() || a.is_list()) ? &a : &b;
      const Value* count = seq == &a ? &b : &a;
      if (!(seq->is_string() || seq->is_list()) || !(count->is_int() || count->is_bool())) {
        return type_error();
      }
      const int64_t n = std::max<int64_t>(0, ival(*count));
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      const size_t limit = seq->is_string() ? kMaxStr : size_t{1} << 20;
      if (unit > 0 && static_cast<uint64_t>(n) > limit / unit) {
        return Err(line, "repetition result too large");
      }
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->as_string();
        return Value::Str(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
      }
      return MakeList(line, std::move(items));
    }
    if (op == "/") {
      if (!nums) return type_error();
      if (b.as_double() == 0) return Err(line, "division by zero");
      return Value::Float(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (a.is_string() && op == "%") return Err(line, "unsupported: string formatting with '%'");
      if (!nums) return type_error();
      if (b.as_double() == 0) return Err(line, "division by zero");
      if (ints) {
        const int64_t x = ival(a), y = ival(b);
        if (y == -1) {
          if (op == "%") return Value::Int(0);
          if (x == std::numeric_limits<int64_t>::min()) return overflow();
          return Value::Int(-x);
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      const double x = a.as_double(), y = b.as_double();
      if (op == "//") return Value::Float(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    if (op == "**") {
      if (ints && ival(b) >= 0) {
        int64_t base = ival(a), exp = ival(b), result = 1;
        while (exp > 0) {
          if (exp & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return overflow();
          }
          exp >>= 1;
          if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
        }
        return Value::Int(result);
      }
      if (nums) return Value::Float(std::pow(a.as_double(), b.as_double()));
      return type_error();
    }
    return Err(line, Cat("unknown operator ", op));
  }

  // ---- calls

  // Binds positional then keyword arguments to `names`; (*out)[i] is null when not given.
  static absl::Status Bind(int line, const Args& args,
                           std::initializer_list<std::string_view> names, std::string_view fn,
                           std::vector<const Value*>* out) {
    out->assign(names.size(), nullptr);
    if (args.pos.size() > names.size()) {
      return Err(line, Cat(fn, "() takes at most ", names.size(), " arguments (", args.pos.size(),
                           " given)"));
    }
    for (size_t i = 0; i < args.pos.size(); ++i) (*out)[i] = &args.pos[i];
    for (const auto& [key, value] : args.kw) {
      auto it = std::find(names.begin(), names.end(), key);
      if (it == names.end()) {
        return Err(line, Cat(fn, "() got an unexpected keyword argument '", key, "'"));
      }
      const size_t i = it - names.begin();
      if ((*out)[i] != nullptr) {
        return Err(line, Cat(fn, "() got multiple values for argument '", key, "'"));
      }
      (*out)[i] = &value;
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<std::optional<std::string>> OptStr(int line, const Value* v,
                                                           std::string_view what) {
    if (v == nullptr || v->is_none()) return std::nullopt;
    if (!v->is_string()) {
      return Err(line, Cat(what, " must be a string, not ", TypeName(*v)));
    }
    return v->as_string();
  }
  static absl::StatusOr<std::string> ReqStr(int line, const Value* v, std::string_view what) {
    if (v == nullptr) return Err(line, Cat(what, " is required"));
    ASSIGN_OR_RETURN(std::optional<std::string> s, OptStr(line, v, what));
    if (!s.has_value()) return Err(line, Cat(what, " must be a string, not NoneType"));
    return *s;
  }
  static absl::StatusOr<int64_t> OptInt(int line, const Value* v, int64_t dflt,
                                        std::string_view what) {
    if (v == nullptr || v->is_none()) return dflt;
    if (v->is_int()) return v->as_int();
    if (v->is_bool()) return static_cast<int64_t>(v->as_bool());
    return Err(line, Cat(what, " must be an integer, not ", TypeName(*v)));
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == ExprKind::kAttr) {
      ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      ASSIGN_OR_RETURN(Args args, EvalArgs(e));
      if (obj.is_string() || obj.is_dict() || obj.is_list()) {
        return Method(e.line, obj, callee.name, args);
      }
      ASSIGN_OR_RETURN(Value f, GetAttr(e.line, obj, callee.name));
      return Call(e.line, f, args);
    }
    ASSIGN_OR_RETURN(Value f, Eval(callee));
    ASSIGN_OR_RETURN(Args args, EvalArgs(e));
    return Call(e.line, f, args);
  }

  absl::StatusOr<Value> Call(int line, const Value& f, const Args& args) {
    if (f.is_undefined()) return UndefinedError(line, f);
    if (!f.is_callable()) {
      return Err(line, Cat("'", TypeName(f), "' object is not callable"));
    }
    const Callable& c = f.as_callable();
    if (c.macro != nullptr) return CallMacro(line, *static_cast<const Stmt*>(c.macro), args);
    std::vector<const Value*> a;
    switch (c.builtin) {
      case kRaiseException: {
        RETURN_IF_ERROR(Bind(line, args, {"message"}, c.name, &a));
        std::string msg;
        if (a[0] != nullptr) {
          ASSIGN_OR_RETURN(msg, ToStr(line, *a[0]));
        }
        return absl::InvalidArgumentError(msg);  // the template's own message, as is
      }
      case kNamespace:
      case kDict: {
        if (args.pos.size() > 1 || (args.pos.size() == 1 && !args.pos[0].is_dict())) {
          return Err(line, Cat(c.name, "() takes keyword arguments or one dict"));
        }
        Attrs attrs;
        if (!args.pos.empty()) attrs = args.pos[0].as_dict();
        for (const auto& [key, value] : args.kw) SetAttr(attrs, key, value);
        if (c.builtin == kDict) return MakeDict(line, std::move(attrs));
        RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(attrs.size()) + 1));
        Namespace& ns = namespaces_.emplace_back();
        ns.attrs = std::move(attrs);
        return Value::Ns(&ns);
      }
      case kStrftimeNow: {
        RETURN_IF_ERROR(Bind(line, args, {"format"}, c.name, &a));
        ASSIGN_OR_RETURN(std::string format, ReqStr(line, a[0], "strftime_now format"));
        if (format.size() > 256) return Err(line, "strftime_now format too long");
        return Value::Str(absl::FormatTime(format, in_.now, in_.time_zone));
      }
      case kRange: {
        if (!args.kw.empty() || args.pos.empty() || args.pos.size() > 3) {
          return Err(line, "range() takes 1 to 3 positional arguments");
        }
        int64_t v[3] = {0, 0, 1};
        for (size_t i = 0; i < args.pos.size(); ++i) {
          ASSIGN_OR_RETURN(v[i], OptInt(line, &args.pos[i], 0, "range() argument"));
        }
        if (args.pos.size() == 1) std::swap(v[0], v[1]);
        const int64_t start = v[0], stop = v[1], step = v[2];
        if (step == 0) return Err(line, "range() step must not be zero");
        const __int128 span = static_cast<__int128>(stop) - start;
        __int128 count = 0;
        if (step > 0 && span > 0) count = (span - 1) / step + 1;
        if (step < 0 && span < 0) count = (-span - 1) / -static_cast<__int128>(step) + 1;
        if (count > ChatTemplate::kMaxRange) {
          return Err(line,
                     Cat("range() too large (more than ", ChatTemplate::kMaxRange, " items)"));
        }
        std::vector<Value> items;
        for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
          items.push_back(Value::Int(start + i * step));
        }
        return MakeList(line, std::move(items));
      }
    }
    return Err(line, "unknown function");
  }

  absl::StatusOr<Value> CallMacro(int line, const Stmt& m, const Args& args) {
    if (calls_ >= ChatTemplate::kMaxCallDepth) return Err(line, "macro calls nested too deep");
    if (args.pos.size() > m.params.size()) {
      return Err(line, Cat("macro '", m.text, "' takes at most ", m.params.size(), " arguments"));
    }
    for (const auto& kv : args.kw) {
      const bool known = std::any_of(m.params.begin(), m.params.end(),
                                     [&](const auto& p) { return p.first == kv.first; });
      if (!known) {
        return Err(line,
                   Cat("macro '", m.text, "' got an unexpected keyword argument '", kv.first, "'"));
      }
    }
    ++calls_;
    const size_t saved_base = macro_base_;
    scopes_.emplace_back();
    macro_base_ = scopes_.size() - 1;
    absl::StatusOr<std::string> out = [&]() -> absl::StatusOr<std::string> {
      for (size_t i = 0; i < m.params.size(); ++i) {
        // Not a structured binding: clang before 16 cannot capture one in the lambda below.
        const std::string& name = m.params[i].first;
        const auto& dflt = m.params[i].second;
        Value v = Value::MakeUndefined(Cat("'", name, "' is undefined"));
        if (i < args.pos.size()) {
          v = args.pos[i];
        } else if (auto it = std::find_if(args.kw.begin(), args.kw.end(),
                                          [&](const auto& kv) { return kv.first == name; });
                   it != args.kw.end()) {
          v = it->second;
        } else if (dflt != nullptr) {
          ASSIGN_OR_RETURN(v, Eval(*dflt));
        }
        scopes_.back()[name] = std::move(v);
      }
      return Capture(m.body);
    }();
    scopes_.pop_back();
    macro_base_ = saved_base;
    --calls_;
    if (!out.ok()) return out.status();
    return Value::Str(std::move(*out));
  }

  // ---- methods of str and dict (lists are immutable here: no append)

  absl::StatusOr<Value> Method(int line, const Value& obj, std::string_view name,
                               const Args& args) {
    std::vector<const Value*> a;
    const std::string fn = Cat(TypeName(obj), ".", name);
    if (obj.is_dict()) {
      if (name == "get") {
        RETURN_IF_ERROR(Bind(line, args, {"key", "default"}, fn, &a));
        if (a[0] == nullptr) return Err(line, "dict.get() needs a key");
        RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(obj.as_dict().size())));
        if (a[0]->is_string()) {
          if (const Value* v = FindAttr(obj.as_dict(), a[0]->as_string())) return *v;
        }
        return a[1] != nullptr ? *a[1] : Value::None();
      }
      if (name == "items" || name == "keys" || name == "values") {
        RETURN_IF_ERROR(Bind(line, args, {}, fn, &a));
        std::vector<Value> out;
        for (const auto& [key, value] : obj.as_dict()) {
          if (name == "keys") {
            out.push_back(Value::Str(key));
          } else if (name == "values") {
            out.push_back(value);
          } else {
            ASSIGN_OR_RETURN(Value pair, MakeList(line, {Value::Str(key), value}));
            out.push_back(std::move(pair));
          }
        }
        return MakeList(line, std::move(out));
      }
      // A callable stored under that key (a macro in a dict) is called.
      ASSIGN_OR_RETURN(Value f, GetAttr(line, obj, name));
      if (f.is_callable()) return Call(line, f, args);
    }
    if (obj.is_string()) {
      const std::string& s = obj.as_string();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        RETURN_IF_ERROR(Bind(line, args, {"chars"}, fn, &a));
        ASSIGN_OR_RETURN(std::optional<std::string> chars, OptStr(line, a[0], "chars"));
        return Value::Str(std::string(PyStrip(s, chars, name != "rstrip", name != "lstrip")));
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        RETURN_IF_ERROR(Bind(line, args, {}, fn, &a));
        if (name == "upper") return Value::Str(AsciiUpper(s));
        if (name == "lower") return Value::Str(AsciiLower(s));
        if (name == "title") return Value::Str(PyTitle(s));
        return Value::Str(PyCapitalize(s));
      }
      if (name == "format") {
        // Python's str.format without format specs: {} and {0} take the positional arguments,
        // {name} the keyword ones, {{ and }} are braces.
        std::string out;
        size_t next = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          const char c = s[i];
          if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
            out += c;
            ++i;
            continue;
          }
          if (c == '}') return Err(line, "str.format: single '}' in the format string");
          if (c != '{') {
            out += c;
            continue;
          }
          const size_t close = s.find('}', i);
          if (close == std::string::npos) return Err(line, "str.format: unclosed '{'");
          const std::string field = s.substr(i + 1, close - i - 1);
          if (field.find_first_of(":!.[{") != std::string::npos) {
            return Err(line, Cat("str.format: unsupported field '{", field, "}'"));
          }
          const Value* arg = nullptr;
          int64_t index = 0;
          if (field.empty()) {
            if (next < args.pos.size()) arg = &args.pos[next++];
          } else if (absl::SimpleAtoi(field, &index)) {
            if (index >= 0 && static_cast<size_t>(index) < args.pos.size()) arg = &args.pos[index];
          } else {
            for (const auto& [key, value] : args.kw) {
              if (key == field) arg = &value;
            }
          }
          if (arg == nullptr) return Err(line, Cat("str.format: no argument for '{", field, "}'"));
          RETURN_IF_ERROR(At(line, AppendStr(*arg, kMaxStr, &out)));
          if (out.size() > kMaxStr) return Err(line, Cat("string exceeds ", kMaxStr, " bytes"));
          i = close;
        }
        return Value::Str(std::move(out));
      }
      if (name == "startswith" || name == "endswith") {
        RETURN_IF_ERROR(Bind(line, args, {"prefix"}, fn, &a));
        if (a[0] == nullptr) return Err(line, Cat(fn, "() needs an argument"));
        std::vector<Value> options = a[0]->is_list() ? a[0]->as_list() : std::vector<Value>{*a[0]};
        for (const Value& o : options) {
          if (!o.is_string()) return Err(line, Cat(fn, "() arguments must be strings"));
          const std::string& p = o.as_string();
          if (p.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                    : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      }
      if (name == "split") {
        RETURN_IF_ERROR(Bind(line, args, {"sep", "maxsplit"}, fn, &a));
        ASSIGN_OR_RETURN(std::optional<std::string> sep, OptStr(line, a[0], "sep"));
        ASSIGN_OR_RETURN(int64_t maxsplit, OptInt(line, a[1], -1, "maxsplit"));
        if (sep.has_value() && sep->empty()) return Err(line, "empty separator");
        std::vector<Value> parts;
        for (std::string& part : PySplit(s, sep, maxsplit))
          parts.push_back(Value::Str(std::move(part)));
        return MakeList(line, std::move(parts));
      }
      if (name == "replace") {
        RETURN_IF_ERROR(Bind(line, args, {"old", "new", "count"}, fn, &a));
        ASSIGN_OR_RETURN(std::string from, ReqStr(line, a[0], "old"));
        ASSIGN_OR_RETURN(std::string to, ReqStr(line, a[1], "new"));
        ASSIGN_OR_RETURN(int64_t count, OptInt(line, a[2], -1, "count"));
        return Replace(line, s, from, to, count);
      }
      if (name == "find" || name == "count") {
        RETURN_IF_ERROR(Bind(line, args, {"sub"}, fn, &a));
        ASSIGN_OR_RETURN(std::string sub, ReqStr(line, a[0], "sub"));
        if (name == "find") {
          const size_t at = s.find(sub);
          if (at == std::string::npos) return Value::Int(-1);
          return Value::Int(
              static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, at))));
        }
        if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) {
          ++n;
        }
        return Value::Int(n);
      }
      if (name == "join") {
        RETURN_IF_ERROR(Bind(line, args, {"iterable"}, fn, &a));
        if (a[0] == nullptr) return Err(line, "str.join() needs an argument");
        std::vector<Value> storage;
        ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, *a[0], &storage));
        std::string out;
        for (size_t i = 0; i < items->size(); ++i) {
          if (!(*items)[i].is_string()) return Err(line, "str.join() items must be strings");
          if (out.size() + s.size() + (*items)[i].as_string().size() > kMaxStr) {
            return Err(line, Cat("string exceeds ", kMaxStr, " bytes"));
          }
          if (i > 0) out += s;
          out += (*items)[i].as_string();
        }
        return Value::Str(std::move(out));
      }
    }
    return Err(line, Cat("'", TypeName(obj), " object' has no method '", name, "'"));
  }

  absl::StatusOr<Value> Replace(int line, std::string_view s, std::string_view from,
                                std::string_view to, int64_t count) {
    std::string out;
    auto add = [&](std::string_view piece) {
      if (out.size() + piece.size() > kMaxStr) return false;
      out.append(piece);
      return true;
    };
    auto too_long = [line] { return Err(line, Cat("string exceeds ", kMaxStr, " bytes")); };
    int64_t done = 0;
    if (from.empty()) {  // Python inserts `to` around every character
      ASSIGN_OR_RETURN(std::vector<std::string_view> chars, Chars(line, s));
      for (std::string_view cp : chars) {
        if ((count < 0 || done++ < count) && !add(to)) return too_long();
        if (!add(cp)) return too_long();
      }
      if ((count < 0 || done < count) && !add(to)) return too_long();
      return Value::Str(std::move(out));
    }
    size_t pos = 0;
    while (count < 0 || done < count) {
      const size_t hit = s.find(from, pos);
      if (hit == std::string_view::npos) break;
      if (!add(s.substr(pos, hit - pos)) || !add(to)) return too_long();
      pos = hit + from.size();
      ++done;
    }
    if (!add(s.substr(pos))) return too_long();
    return Value::Str(std::move(out));
  }

  // ---- filters

  // Follows a dotted attribute path ("a.b", "items.0") as Jinja's attribute filters do.
  absl::StatusOr<Value> AttrPath(int line, const Value& item, std::string_view path) {
    Value v = item;
    for (std::string_view part : SplitChar(path, '.')) {
      int64_t index;
      if (absl::SimpleAtoi(AV(part), &index)) {
        ASSIGN_OR_RETURN(v, GetItem(line, v, Value::Int(index)));
      } else {
        ASSIGN_OR_RETURN(v, GetAttr(line, v, part));
      }
    }
    return v;
  }

  absl::StatusOr<Value> Filter(int line, std::string_view name, const Value& v, const Args& args) {
    std::vector<const Value*> a;
    if (name == "default" || name == "d") {
      RETURN_IF_ERROR(Bind(line, args, {"default_value", "boolean"}, name, &a));
      const bool use = v.is_undefined() || (a[1] != nullptr && Truthy(*a[1]) && !Truthy(v));
      if (!use) return v;
      return a[0] != nullptr ? *a[0] : Value::Str("");
    }
    if (name == "safe") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      return v;
    }
    if (name == "trim" || name == "string" || name == "lower" || name == "upper" ||
        name == "capitalize" || name == "title" || name == "escape" || name == "e") {
      RETURN_IF_ERROR(Bind(line, args,
                           name == "trim" ? std::initializer_list<std::string_view>{"chars"}
                                          : std::initializer_list<std::string_view>{},
                           name, &a));
      ASSIGN_OR_RETURN(std::string s, ToStr(line, v));
      if (name == "trim") {
        ASSIGN_OR_RETURN(std::optional<std::string> chars, OptStr(line, a[0], "chars"));
        return Value::Str(std::string(PyStrip(s, chars, true, true)));
      }
      if (name == "lower") return Value::Str(AsciiLower(s));
      if (name == "upper") return Value::Str(AsciiUpper(s));
      if (name == "capitalize") return Value::Str(PyCapitalize(s));
      if (name == "title") return Value::Str(PyTitle(s));
      if (name == "escape" || name == "e") {
        std::string out;
        for (char c : s) {
          switch (c) {
            case '&':
              out += "&amp;";
              break;
            case '<':
              out += "&lt;";
              break;
            case '>':
              out += "&gt;";
              break;
            case '"':
              out += "&#34;";
              break;
            case '\'':
              out += "&#39;";
              break;
            default:
              out.push_back(c);
          }
        }
        return Value::Str(std::move(out));
      }
      return Value::Str(std::move(s));
    }
    if (name == "length" || name == "count") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      switch (v.kind()) {
        case Value::Kind::kString:
          return Value::Int(static_cast<int64_t>(CodePointCount(v.as_string())));
        case Value::Kind::kList:
          return Value::Int(static_cast<int64_t>(v.as_list().size()));
        case Value::Kind::kDict:
          return Value::Int(static_cast<int64_t>(v.as_dict().size()));
        case Value::Kind::kUndefined:
          return Value::Int(0);
        default:
          return Err(line, Cat("object of type '", TypeName(v), "' has no len()"));
      }
    }
    if (name == "from_json") {
      // Not Jinja's: llama.cpp's and minja's extension, which DeepSeek V3.2's and V4's templates
      // use to read a call's arguments given as JSON text.
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      if (!v.is_string()) return Err(line, Cat("from_json of a ", TypeName(v), ", not a string"));
      absl::StatusOr<OrderedJson> json = ParseOrderedJson(v.as_string(), "from_json");
      if (!json.ok()) return Err(line, std::string(json.status().message()));
      return FromJson(*json, "from_json");
    }
    if (name == "tojson") {
      RETURN_IF_ERROR(
          Bind(line, args, {"indent", "ensure_ascii", "separators", "sort_keys"}, name, &a));
      JsonOptions options;
      if (a[0] != nullptr && !a[0]->is_none()) {
        if (a[0]->is_string()) {
          options.indent = a[0]->as_string();
        } else {
          ASSIGN_OR_RETURN(int64_t n, OptInt(line, a[0], 0, "indent"));
          options.indent = std::string(std::clamp<int64_t>(n, 0, 64), ' ');
        }
        options.item_separator = ",";
      }
      if (a[1] != nullptr) options.ensure_ascii = Truthy(*a[1]);
      if (a[2] != nullptr && !a[2]->is_none()) {
        const Value& sep = *a[2];
        if (!sep.is_list() || sep.as_list().size() != 2 || !sep.as_list()[0].is_string() ||
            !sep.as_list()[1].is_string()) {
          return Err(line, "tojson separators must be a pair of strings");
        }
        options.item_separator = sep.as_list()[0].as_string();
        options.key_separator = sep.as_list()[1].as_string();
      }
      if (a[3] != nullptr) options.sort_keys = Truthy(*a[3]);
      std::string out;
      RETURN_IF_ERROR(At(line, AppendJson(v, options, kMaxStr, &out)));
      return Value::Str(std::move(out));
    }
    if (name == "first" || name == "last") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      if (items->empty()) return Value::MakeUndefined(Cat("no ", name, " item"));
      return name == "first" ? items->front() : items->back();
    }
    if (name == "list" || name == "reverse") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      if (name == "reverse" && v.is_string()) {
        ASSIGN_OR_RETURN(std::vector<std::string_view> chars, Chars(line, v.as_string()));
        std::string out;
        for (size_t i = chars.size(); i-- > 0;) out.append(chars[i]);
        return Value::Str(std::move(out));
      }
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      std::vector<Value> out(*items);
      if (name == "reverse") std::reverse(out.begin(), out.end());
      return MakeList(line, std::move(out));
    }
    if (name == "items") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      if (v.is_undefined()) return MakeList(line, {});
      if (!v.is_dict()) return Err(line, "items filter requires a mapping");
      return Method(line, v, "items", Args{});
    }
    if (name == "join") {
      RETURN_IF_ERROR(Bind(line, args, {"d", "attribute"}, name, &a));
      ASSIGN_OR_RETURN(std::optional<std::string> sep, OptStr(line, a[0], "join separator"));
      ASSIGN_OR_RETURN(std::optional<std::string> attr, OptStr(line, a[1], "attribute"));
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        if (i > 0 && sep.has_value()) {
          if (out.size() + sep->size() > kMaxStr) {
            return Err(line, Cat("string exceeds ", kMaxStr, " bytes"));
          }
          out += *sep;
        }
        Value item = (*items)[i];
        if (attr.has_value()) {
          ASSIGN_OR_RETURN(item, AttrPath(line, item, *attr));
        }
        RETURN_IF_ERROR(At(line, AppendStr(item, kMaxStr, &out)));
      }
      return Value::Str(std::move(out));
    }
    if (name == "replace") {
      RETURN_IF_ERROR(Bind(line, args, {"old", "new", "count"}, name, &a));
      ASSIGN_OR_RETURN(std::string s, ToStr(line, v));
      ASSIGN_OR_RETURN(std::string from, ReqStr(line, a[0], "old"));
      ASSIGN_OR_RETURN(std::string to, ReqStr(line, a[1], "new"));
      ASSIGN_OR_RETURN(int64_t count, OptInt(line, a[2], -1, "count"));
      return Replace(line, s, from, to, count);
    }
    if (name == "int" || name == "float") {
      RETURN_IF_ERROR(Bind(line, args,
                           name == "int"
                               ? std::initializer_list<std::string_view>{"default", "base"}
                               : std::initializer_list<std::string_view>{"default"},
                           name, &a));
      return ToNumber(line, v, name == "int", a);
    }
    if (name == "abs") {
      RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
      if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
      if (v.is_int() || v.is_bool()) {
        const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
        if (x == std::numeric_limits<int64_t>::min()) return Err(line, "integer overflow");
        return Value::Int(x < 0 ? -x : x);
      }
      return Err(line, Cat("bad operand type for abs(): '", TypeName(v), "'"));
    }
    if (name == "round") {
      RETURN_IF_ERROR(Bind(line, args, {"precision", "method"}, name, &a));
      if (!v.is_number()) return Err(line, "round filter requires a number");
      ASSIGN_OR_RETURN(int64_t precision, OptInt(line, a[0], 0, "precision"));
      ASSIGN_OR_RETURN(std::optional<std::string> method, OptStr(line, a[1], "method"));
      const double scale =
          std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -308, 308)));
      const double x = v.as_double() * scale;
      double r;
      if (!method.has_value() || *method == "common") {
        r = std::nearbyint(x);
      } else if (*method == "ceil") {
        r = std::ceil(x);
      } else if (*method == "floor") {
        r = std::floor(x);
      } else {
        return Err(line, "round method must be 'common', 'ceil' or 'floor'");
      }
      return Value::Float(r / scale);
    }
    if (name == "indent") {
      RETURN_IF_ERROR(Bind(line, args, {"width", "first", "blank"}, name, &a));
      ASSIGN_OR_RETURN(std::string s, ToStr(line, v));
      std::string pad;
      if (a[0] != nullptr && a[0]->is_string()) {
        pad = a[0]->as_string();
      } else {
        ASSIGN_OR_RETURN(int64_t width, OptInt(line, a[0], 4, "width"));
        pad = std::string(std::clamp<int64_t>(width, 0, 256), ' ');
      }
      const bool first = a[1] != nullptr && Truthy(*a[1]);
      const bool blank = a[2] != nullptr && Truthy(*a[2]);
      std::vector<std::string_view> lines = SplitChar(s, '\n');
      if (!s.empty() && s.back() == '\n') lines.pop_back();
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) out += '\n';
        if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
        if (out.size() + lines[i].size() > kMaxStr) {
          return Err(line, Cat("string exceeds ", kMaxStr, " bytes"));
        }
        out += lines[i];
      }
      if (!s.empty() && s.back() == '\n') out += '\n';
      return Value::Str(std::move(out));
    }
    if (name == "map") {
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      std::vector<Value> out;
      const Value* attribute = nullptr;
      const Value* dflt = nullptr;
      for (const auto& [key, value] : args.kw) {
        if (key == "attribute") attribute = &value;
        if (key == "default") dflt = &value;
      }
      if (attribute != nullptr) {
        if (!args.pos.empty() || args.kw.size() > (dflt != nullptr ? 2u : 1u)) {
          return Err(line, "map(attribute=...) takes only attribute and default");
        }
        ASSIGN_OR_RETURN(std::string path, ReqStr(line, attribute, "attribute"));
        for (const Value& item : *items) {
          ASSIGN_OR_RETURN(Value x, AttrPath(line, item, path));
          if (x.is_undefined() && dflt != nullptr) x = *dflt;
          out.push_back(std::move(x));
        }
        return MakeList(line, std::move(out));
      }
      if (args.pos.empty() || !args.pos[0].is_string()) {
        return Err(line, "map needs a filter name or attribute=");
      }
      const std::string filter = args.pos[0].as_string();
      if (!IsKnownFilter(filter) || filter == "map") {
        return Err(line, Cat("map: unknown filter '", filter, "'"));
      }
      Args rest{std::vector<Value>(args.pos.begin() + 1, args.pos.end()), args.kw};
      for (const Value& item : *items) {
        ASSIGN_OR_RETURN(Value x, Filter(line, filter, item, rest));
        out.push_back(std::move(x));
      }
      return MakeList(line, std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool select = name == "select" || name == "selectattr";
      if (!args.kw.empty()) return Err(line, Cat(name, "() takes no keyword arguments"));
      size_t next = 0;
      std::string path;
      if (by_attr) {
        if (args.pos.empty()) return Err(line, Cat(name, "() needs an attribute"));
        ASSIGN_OR_RETURN(path, ReqStr(line, &args.pos[0], "attribute"));
        next = 1;
      }
      std::optional<std::string> test;
      if (next < args.pos.size()) {
        ASSIGN_OR_RETURN(test, ReqStr(line, &args.pos[next], "test name"));
        ++next;
        if (!IsKnownTest(*test)) return Err(line, Cat("unknown test '", *test, "'"));
      }
      Args test_args{std::vector<Value>(args.pos.begin() + next, args.pos.end()), {}};
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      std::vector<Value> out;
      for (const Value& item : *items) {
        Value x = item;
        if (by_attr) {
          ASSIGN_OR_RETURN(x, AttrPath(line, item, path));
        }
        bool r = Truthy(x);
        if (test.has_value()) {
          ASSIGN_OR_RETURN(r, Test(line, *test, x, test_args));
        }
        if (r == select) out.push_back(item);
      }
      return MakeList(line, std::move(out));
    }
    if (name == "min" || name == "max" || name == "unique") {
      // Jinja's: by the items (or their `attribute`), strings case-insensitively unless
      // case_sensitive; min/max of nothing is undefined; unique keeps each first occurrence.
      RETURN_IF_ERROR(Bind(line, args, {"case_sensitive", "attribute"}, name, &a));
      const bool case_sensitive = a[0] != nullptr && Truthy(*a[0]);
      ASSIGN_OR_RETURN(std::optional<std::string> attr, OptStr(line, a[1], "attribute"));
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(items->size()) * 20));
      std::vector<Value> keys;
      for (const Value& item : *items) {
        Value key = item;
        if (attr.has_value()) {
          ASSIGN_OR_RETURN(key, AttrPath(line, item, *attr));
        }
        if (key.is_string() && !case_sensitive) key = Value::Str(AsciiLower(key.as_string()));
        keys.push_back(std::move(key));
      }
      if (name == "unique") {
        std::vector<Value> out;
        std::vector<const Value*> seen;
        for (size_t i = 0; i < items->size(); ++i) {
          bool dup = false;
          for (const Value* k : seen) dup = dup || Equals(*k, keys[i], &budget_);
          if (dup) continue;
          RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(seen.size())));
          seen.push_back(&keys[i]);
          out.push_back((*items)[i]);
        }
        return MakeList(line, std::move(out));
      }
      if (items->empty()) return Value::MakeUndefined(Cat("no ", name, " item"));
      size_t best = 0;
      for (size_t i = 1; i < keys.size(); ++i) {
        const Value& x = keys[i];
        const Value& y = keys[best];
        bool less;
        if (x.is_number() && y.is_number()) {
          less = x.as_double() < y.as_double();
        } else if (x.is_string() && y.is_string()) {
          less = x.as_string() < y.as_string();
        } else {
          return Err(line, Cat(name, ": items must be all numbers or all strings"));
        }
        const bool greater = !less && !Equals(x, y, &budget_);
        if (name == "min" ? less : greater) best = i;
      }
      return (*items)[best];
    }
    if (name == "dictsort") {
      // Jinja's: the (key, value) pairs sorted by key (or by='value'), strings
      // case-insensitively unless case_sensitive.
      RETURN_IF_ERROR(Bind(line, args, {"case_sensitive", "by", "reverse"}, name, &a));
      const bool case_sensitive = a[0] != nullptr && Truthy(*a[0]);
      ASSIGN_OR_RETURN(std::optional<std::string> by, OptStr(line, a[1], "by"));
      const bool reverse = a[2] != nullptr && Truthy(*a[2]);
      if (by.has_value() && *by != "key" && *by != "value") {
        return Err(line, "dictsort: by must be 'key' or 'value'");
      }
      if (!v.is_dict()) return Err(line, "dictsort filter requires a mapping");
      ASSIGN_OR_RETURN(Value pairs, Method(line, v, "items", Args{}));
      const bool by_value = by.has_value() && *by == "value";
      Args sort_args;
      sort_args.kw.emplace_back("attribute", Value::Str(by_value ? "1" : "0"));
      sort_args.kw.emplace_back("case_sensitive", Value::Bool(case_sensitive));
      sort_args.kw.emplace_back("reverse", Value::Bool(reverse));
      return Filter(line, "sort", pairs, sort_args);
    }
    if (name == "sort") {
      RETURN_IF_ERROR(Bind(line, args, {"reverse", "case_sensitive", "attribute"}, name, &a));
      const bool reverse = a[0] != nullptr && Truthy(*a[0]);
      const bool case_sensitive = a[1] != nullptr && Truthy(*a[1]);
      ASSIGN_OR_RETURN(std::optional<std::string> attr, OptStr(line, a[2], "attribute"));
      std::vector<Value> storage;
      ASSIGN_OR_RETURN(const std::vector<Value>* items, Iter(line, v, &storage));
      // Sort keys must all be numbers or all strings, so the order is total.
      std::vector<std::pair<Value, size_t>> keyed;
      bool numbers = true, strings = true;
      for (size_t i = 0; i < items->size(); ++i) {
        Value key = (*items)[i];
        if (attr.has_value()) {
          ASSIGN_OR_RETURN(key, AttrPath(line, key, *attr));
        }
        if (key.is_string() && !case_sensitive) key = Value::Str(AsciiLower(key.as_string()));
        numbers = numbers && key.is_number();
        strings = strings && key.is_string();
        keyed.emplace_back(std::move(key), i);
      }
      if (!numbers && !strings) return Err(line, "sort: items must be all numbers or all strings");
      RETURN_IF_ERROR(Charge(line, static_cast<int64_t>(keyed.size()) * 20));
      auto less = [&](const Value& x, const Value& y) {
        if (!numbers) return x.as_string() < y.as_string();
        const double dx = x.as_double(), dy = y.as_double();
        return std::isnan(dx) ? false : (std::isnan(dy) ? true : dx < dy);  // NaN last: total
      };
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return reverse ? less(y.first, x.first) : less(x.first, y.first);
      });
      std::vector<Value> out;
      for (const auto& k : keyed) out.push_back((*items)[k.second]);
      return MakeList(line, std::move(out));
    }
    return Err(line, Cat("unknown filter '", name, "'"));
  }

  absl::StatusOr<Value> ToNumber(int line, const Value& v, bool to_int,
                                 const std::vector<const Value*>& a) {
    const Value dflt = a[0] != nullptr ? *a[0] : (to_int ? Value::Int(0) : Value::Float(0));
    int64_t base = 10;
    if (to_int) {
      ASSIGN_OR_RETURN(base, OptInt(line, a[1], 10, "base"));
    }
    if (base < 2 || base > 36) return Err(line, "int base must be in [2, 36]");
    double d;
    if (v.is_int() || v.is_bool()) {
      const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
      return to_int ? Value::Int(x) : Value::Float(static_cast<double>(x));
    }
    if (v.is_float()) {
      d = v.as_float();
    } else if (v.is_string()) {
      const std::string s(PyStrip(v.as_string(), std::nullopt, true, true));
      if (to_int && !s.empty()) {
        errno = 0;
        char* end = nullptr;
        const long long x = std::strtoll(s.c_str(), &end, static_cast<int>(base));
        if (errno == 0 && end == s.c_str() + s.size()) return Value::Int(x);
      }
      if (!absl::SimpleAtod(s, &d)) return dflt;
    } else {
      return dflt;
    }
    if (!to_int) return Value::Float(d);
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value::Int(static_cast<int64_t>(d));
  }

  // ---- tests

  absl::StatusOr<bool> Test(int line, std::string_view name, const Value& v, const Args& args) {
    std::vector<const Value*> a;
    static constexpr std::string_view kBinary[] = {
        "equalto", "eq", "sameas",      "ne", "lt", "lessthan",
        "le",      "gt", "greaterthan", "ge", "in", "divisibleby"};
    if (InSet(kBinary, name)) {
      RETURN_IF_ERROR(Bind(line, args, {"other"}, name, &a));
      if (a[0] == nullptr) return Err(line, Cat("test '", name, "' needs an argument"));
      const Value& o = *a[0];
      if (name == "equalto" || name == "eq") return Eq(line, v, o);
      if (name == "sameas") {
        ASSIGN_OR_RETURN(bool eq, Eq(line, v, o));
        return eq && v.kind() == o.kind();
      }
      if (name == "ne") return CompareOp(line, "!=", v, o);
      if (name == "lt" || name == "lessthan") return CompareOp(line, "<", v, o);
      if (name == "le") return CompareOp(line, "<=", v, o);
      if (name == "gt" || name == "greaterthan") return CompareOp(line, ">", v, o);
      if (name == "ge") return CompareOp(line, ">=", v, o);
      if (name == "in") return ContainsValue(line, o, v);
      // divisibleby
      if (!(v.is_int() || v.is_bool()) || !(o.is_int() || o.is_bool())) {
        return Err(line, "divisibleby needs integers");
      }
      const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
      const int64_t y = o.is_bool() ? o.as_bool() : o.as_int();
      if (y == 0) return Err(line, "division by zero");
      return y == -1 || x % y == 0;
    }
    RETURN_IF_ERROR(Bind(line, args, {}, name, &a));
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    // Jinja's Undefined is iterable (as empty) and has len(), so it passes these two.
    if (name == "iterable" || name == "sequence") {
      return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    }
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "callable") return v.is_callable();
    if (name == "odd" || name == "even") {
      if (!(v.is_int() || v.is_bool())) return Err(line, Cat(name, " needs an integer"));
      const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
      return (x % 2 != 0) == (name == "odd");
    }
    if (name == "lower" || name == "upper") {
      if (!v.is_string()) return false;
      return v.as_string() ==
             (name == "lower" ? AsciiLower(v.as_string()) : AsciiUpper(v.as_string()));
    }
    return Err(line, Cat("unknown test '", name, "'"));
  }

  const ChatTemplateInputs& in_;
  const bool empty_call_content_;
  std::vector<Scope> scopes_;
  size_t macro_base_ = 0;  // inside a macro: its scope's index (lookups skip the caller's)
  std::string* out_ = nullptr;
  std::deque<Namespace> namespaces_;  // the render's arena; values point into it
  int64_t iterations_ = 0;
  int64_t budget_ = ChatTemplate::kMaxWork;
  int depth_ = 0;
  int calls_ = 0;
};

}  // namespace
}  // namespace jinja

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::shared_ptr<const jinja::Program> program, jinja::ParseTemplate(source));
  return ChatTemplate(std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  if (program_ == nullptr) return absl::FailedPreconditionError("chat_template: not parsed");
  absl::StatusOr<std::string> out = jinja::Evaluator(inputs, false).Run(program_->body);
  if (out.ok()) return out;
  // Many templates treat content as a string on every turn ('</think>' in message.content,
  // message.content + ...) and fail on a tool-call turn whose content is none: such a turn is
  // rendered again with content "", as vLLM passes it (llama.cpp's templates likewise get an
  // empty string where they require one). The first error stands if that fails too.
  // Only an error about a none (NoneType) is retried: one of another kind is the template's own
  // and the retry could only dodge it down another branch.
  const bool null_content =
      std::any_of(inputs.messages.begin(), inputs.messages.end(),
                  [](const ChatMessage& m) { return m.content.empty() && !m.tool_calls.empty(); });
  if (!null_content || !absl::StrContains(out.status().message(), "NoneType")) return out;
  absl::StatusOr<std::string> retry = jinja::Evaluator(inputs, true).Run(program_->body);
  return retry.ok() ? retry : out;
}

}  // namespace kvrm
