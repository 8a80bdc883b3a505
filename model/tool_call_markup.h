// The tool-call formats that are not one JSON value (model/tool_calls.h lists them): the XML-like
// ones that write each argument as text (qwen3_coder, glm45, minimax_m2) and the ones that write
// the arguments as JSON between their own special tokens (deepseek_v3, kimi_k2). One parser per
// format reads a whole reply, or a reply cut anywhere while it streams (`partial`), so the
// stream's deltas and the final calls come from the same reading. Internal to //model:tool_calls.
#ifndef KVRM_MODEL_TOOL_CALL_MARKUP_H_
#define KVRM_MODEL_TOOL_CALL_MARKUP_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tool_calls.h"

namespace kvrm::tool_markup {

// Whether `format` is read here (not by the JSON scanners of tool_calls.cc). Mistral's calls
// are read here too when they are in its v11+ form ([TOOL_CALLS]NAME[ARGS]{...}): whether
// `text` (from the marker) is, once its first character after the marker is there.
bool Handles(ToolCallFormat format);
std::optional<bool> MistralNamedForm(std::string_view text);

// A call as far as the text goes.
struct Call {
  std::string name;  // "" until the whole name is known
  // The arguments' JSON text: the whole object once `closed`; before, the part of it that later
  // text cannot change ("{" and the parameters read so far for the XML-like formats, the model's
  // own text so far for the JSON ones), which may be empty.
  std::string arguments;
  bool closed = false;
};
struct Calls {
  std::vector<Call> calls;
  std::string text;  // text around the calls, whitespace dropped (whole replies only)
  // A partial reading that stops inside a JSON object (the last call's arguments, or minimax's
  // call object): where it begins. Until it closes, later text changes nothing but its length.
  size_t open_json = std::string_view::npos;
};

// Reads `text` (from the format's start marker on). A whole reply (`partial` false) must hold
// only well-formed calls (INVALID_ARGUMENT naming what is wrong otherwise; every call closed,
// though a last block cut at its end marker is taken); a partial one is read up to where it
// stops or turns malformed, never an error.
absl::StatusOr<Calls> Parse(ToolCallFormat format, std::string_view text,
                            const ToolParamTypes& types, bool partial);

// The format's start marker, and every marker it writes (for keeping special tokens).
std::string_view StartMarker(ToolCallFormat format);
std::vector<std::string_view> Markers(ToolCallFormat format);

// Text helpers both readers use.
std::string_view Strip(std::string_view s);      // ASCII whitespace off both ends
size_t SkipSpace(std::string_view s, size_t i);  // past ASCII whitespace from i
// Bracket depth outside strings, a character at a time.
struct JsonDepth {
  int depth = 0;
  bool in_string = false, escape = false;
  bool Step(char c);  // whether `c` closes the outermost array or object
};
// The end (one past the closing bracket) of the JSON array or object that starts at s[i], by
// bracket depth outside strings; npos when it does not close. The text is parsed properly after.
size_t JsonValueEnd(std::string_view s, size_t i);

// Whether text[from..] (what a streamed reply gained since it was last read) can change the
// partial reading of `text`: a reading skipped when it cannot costs nothing, so that a long
// value is not read again a token at a time. A change may wait for the tag it is part of to
// close (a value that runs to the next "<parameter=" is read at that tag's '>').
bool MayChange(ToolCallFormat format, std::string_view text, size_t from);
// Appends `piece` stripped, on a line of its own, unless it is only whitespace.
void AppendLeftover(std::string_view piece, std::string* out);

}  // namespace kvrm::tool_markup

#endif  // KVRM_MODEL_TOOL_CALL_MARKUP_H_
