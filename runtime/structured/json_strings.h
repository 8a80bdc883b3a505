// JSON strings as regexes: the string grammar (one character, with its escapes, as JSON Schema
// counts characters), and the translation of a "pattern" (a regex over decoded characters) into
// the language of the string contents that spell a match.
//
// Every text these generate is a JSON string a strict parser (nlohmann's) accepts: lone
// surrogate escapes are left out.
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_STRINGS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_STRINGS_H_

#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

// One character of a JSON string: itself, a two-character escape, \uXXXX for a code point outside
// the surrogates, or a surrogate pair \uD8xx\uDCxx (one character, as JSON Schema counts them).
Regex JsonStringChar();

// Any JSON string, quotes included.
Regex JsonString();

// `content` between double quotes.
Regex Quote(Regex content);

// A pattern's tree over decoded characters (what ParseRegex returns) -> the same language as JSON
// string content: characters JSON must escape become their one canonical escape (\" \\ \n ...
// \u001f, as nlohmann writes them), the rest stand for themselves. "." loses \r, U+2028 and
// U+2029 too (ECMAScript's "." excludes them), so every generated string is a match.
Regex PatternContent(const Regex& pattern);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_STRINGS_H_
