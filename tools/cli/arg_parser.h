// Command-line parsing for kvrm_cli: `kvrm_cli <command> [flags]`.
//
// The flags are ordinary Abseil flags (ABSL_FLAG), looked up by name and set through
// absl::CommandLineFlag::ParseFrom, but parsed here instead of by absl::ParseCommandLine so that
//   - each command accepts only its own flags (a stray --prompt on `info` is an error),
//   - a flag may repeat and every value is kept (--stop=a --stop=b), and
//   - every mistake comes back as a Status, so the caller exits 2 (usage) rather than the 1 that
//     ParseCommandLine's exit would give, which kvrm_cli reserves for RPC failures.
#ifndef KVRM_TOOLS_CLI_ARG_PARSER_H_
#define KVRM_TOOLS_CLI_ARG_PARSER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrm::cli {

struct ParsedFlags {
  // --help or -h was given.
  bool help = false;
  // Every raw value given to each flag, in command-line order ("true"/"false" for bare booleans).
  // The flags themselves already hold the last value.
  std::map<std::string, std::vector<std::string>, std::less<>> given;
};

// Parses `args` (the arguments after the command) and sets the named Abseil flags. Accepted forms:
// --name=value, -name=value, --name value (non-boolean flags), --name and --noname (booleans).
// Only names in `allowed` are accepted; positional arguments are errors. Errors are
// InvalidArgument with a message fit for the user.
absl::StatusOr<ParsedFlags> ParseFlags(absl::Span<const std::string> args,
                                       absl::Span<const absl::string_view> allowed);

// One help line per allowed flag: "  --name=<default>  help".
std::string FlagsHelp(absl::Span<const absl::string_view> allowed);

}  // namespace kvrm::cli

#endif  // KVRM_TOOLS_CLI_ARG_PARSER_H_
