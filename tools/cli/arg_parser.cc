#include "tools/cli/arg_parser.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace kvrm::cli {
namespace {

bool IsAllowed(absl::Span<const absl::string_view> allowed, absl::string_view name) {
  return std::find(allowed.begin(), allowed.end(), name) != allowed.end();
}

// Finds an allowed flag; unknown and not-allowed names are distinct errors so that the message says
// whether the flag exists at all.
absl::StatusOr<absl::CommandLineFlag*> Lookup(absl::Span<const absl::string_view> allowed,
                                              absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || !IsAllowed(allowed, name)) {
    return absl::InvalidArgumentError(
        flag == nullptr ? absl::StrCat("unknown flag --", name)
                        : absl::StrCat("flag --", name, " does not apply to this command"));
  }
  return flag;
}

}  // namespace

absl::StatusOr<ParsedFlags> ParseFlags(absl::Span<const std::string> args,
                                       absl::Span<const absl::string_view> allowed) {
  ParsedFlags parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i + 1], "'"));
      }
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    if (arg == "help" || arg == "h") {
      parsed.help = true;
      continue;
    }
    const size_t eq = arg.find('=');
    absl::string_view name = arg.substr(0, eq);
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else {
      absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      absl::string_view negated = name;
      if (flag == nullptr && absl::ConsumePrefix(&negated, "no")) {
        absl::CommandLineFlag* positive = absl::FindCommandLineFlag(negated);
        if (positive != nullptr && positive->IsOfType<bool>()) {
          name = negated;
          flag = positive;
          value = "false";
        }
      }
      if (value.empty()) {
        if (flag != nullptr && flag->IsOfType<bool>()) {
          value = "true";
        } else if (flag != nullptr && IsAllowed(allowed, name)) {
          if (i + 1 >= args.size()) {
            return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
          }
          value = args[++i];
        }
      }
    }
    absl::StatusOr<absl::CommandLineFlag*> flag = Lookup(allowed, name);
    if (!flag.ok()) return flag.status();
    std::string error;
    if (!(*flag)->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(error);  // absl's message names the flag and value
    }
    parsed.given[std::string(name)].push_back(std::move(value));
  }
  return parsed;
}

std::string FlagsHelp(absl::Span<const absl::string_view> allowed) {
  std::vector<std::string> lefts;
  size_t width = 0;
  for (absl::string_view name : allowed) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    lefts.push_back(flag == nullptr ? std::string(name)
                                    : absl::StrCat("--", name, "=", flag->DefaultValue()));
    width = std::max(width, lefts.back().size());
  }
  std::string out;
  for (size_t i = 0; i < allowed.size(); ++i) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(allowed[i]);
    absl::StrAppendFormat(&out, "  %-*s  %s\n", static_cast<int>(width), lefts[i],
                          flag == nullptr ? "" : flag->Help());
  }
  return out;
}

}  // namespace kvrm::cli
