// Chat-template internals: the AST of a parsed template and the parser (a lexer applying
// Jinja's whitespace control with trim_blocks and lstrip_blocks, then recursive descent with
// Jinja's operator precedence). Internal to the chat_template library; see chat_template.h.
#ifndef KVRM_MODEL_CHAT_TEMPLATE_PARSER_H_
#define KVRM_MODEL_CHAT_TEMPLATE_PARSER_H_

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/chat_template_value.h"

namespace kvrm::jinja {

inline constexpr char kErrorPrefix[] = "chat_template: ";

// ---- AST --------------------------------------------------------------------------------------

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBinary,
  kConcat,
  kCompare,
  kAnd,
  kOr,
  kCond,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// One node type for all expressions; which fields are used depends on `kind`:
//   kLiteral: literal.  kName: name.  kList/kTuple: args = items.  kDict: args = k0, v0, k1, ...
//   kAttr: args[0] . name.  kItem: args[0] [ args[1] ].  kSlice: args[0] [args[1]:args[2]:args[3]]
//   (null parts absent).  kCall: args[0] callee, args[1..] positional, kwargs.  kFilter/kTest:
//   args[0] operand, args[1..] positional, kwargs, name (kTest: negated).  kNeg/kPos/kNot: args[0].
//   kBinary: args[0] name(op) args[1].  kConcat: args joined with ~.  kCompare: args[0] ops[0]
//   args[1] ops[1] ...  kAnd/kOr: args[0], args[1].  kCond: args[0] if args[1] else args[2].
struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  size_t offset = 0;
  int depth = 1;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetAttr,
  kSetBlock,
  kMacro,
  kBreak,
  kContinue,
  kBlock,
  kFilterBlock
};

// The name a filter block's captured body takes in its filter chain (no template can spell it).
inline constexpr char kFilterBlockOperand[] = " filter block";

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;                  // kText: the text; kMacro: its name; kSetAttr: the attribute
  ExprPtr expr;  // kOutput; kSet/kSetAttr value; kFor iterable; kFilterBlock: the filter chain
  ExprPtr filter;                    // kFor: inline `if`
  std::vector<std::string> targets;  // kFor/kSet/kSetBlock names; kSetAttr: the namespace
  bool unpack = false;               // targets are a tuple
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf (a null condition is the else)
  Body body;  // kFor, kSetBlock, kMacro, kBlock, kFilterBlock
  Body else_body;                                       // kFor
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (defaults may be null)
};

struct Program {
  Body body;
};

// Parses a template as ChatTemplate::Parse documents (newlines normalized, one trailing newline
// dropped, as Jinja does). INVALID_ARGUMENT "chat_template: line L col C: ..." on errors.
absl::StatusOr<std::shared_ptr<const Program>> ParseTemplate(std::string_view source);

// Whether the filter / test exists (the parser rejects unknown names; map/select check theirs
// at render time).
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

template <size_t N>
bool InSet(const std::string_view (&set)[N], std::string_view s) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}

// Counts one level of recursion for as long as it lives (the parser's and evaluator's bounds).
class DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* depth_;
};

}  // namespace kvrm::jinja

#endif  // KVRM_MODEL_CHAT_TEMPLATE_PARSER_H_
