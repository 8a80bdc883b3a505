#include "runtime/structured/json_string_formats.h"

#include "runtime/structured/json_number_ranges.h"
#include "runtime/structured/regex_builders.h"

namespace kvrm::structured {
namespace {

Regex L(const char* text) { return Literal(text); }

Regex DateRegex() {
  const Regex year = Times(Digit(), 4);
  // Two-digit multiples of 4 other than 00.
  const Regex by4 = Alt({Concat({L("0"), Chars("48")}), Concat({Chars("2468"), Chars("048")}),
                         Concat({Chars("13579"), Chars("26")})});
  // Gregorian: divisible by 4, and centuries only when divisible by 400.
  const Regex leap_year =
      Alt({Concat({Digit(), Digit(), by4}), Concat({Alt({by4, L("00")}), L("00")})});
  const Regex long_month = Alt({L("01"), L("03"), L("05"), L("07"), L("08"), L("10"), L("12")});
  const Regex short_month = Alt({L("04"), L("06"), L("09"), L("11")});
  return Alt({Concat({year, L("-"), long_month, L("-"), SameLengthNumerals("01", "31")}),
              Concat({year, L("-"), short_month, L("-"), SameLengthNumerals("01", "30")}),
              Concat({year, L("-02-"), SameLengthNumerals("01", "28")}),
              Concat({leap_year, L("-02-29")})});
}

// RFC 3339 full-time. Leap seconds (:60) are left out: validators accept them only at 23:59 UTC.
Regex TimeRegex() {
  const Regex hour = SameLengthNumerals("00", "23");
  const Regex minute = SameLengthNumerals("00", "59");
  return Concat({hour, L(":"), minute, L(":"), minute, Optional(Concat({L("."), Plus(Digit())})),
                 Alt({L("Z"), Concat({Chars("+-"), hour, L(":"), minute})})});
}

Regex UuidRegex() {
  const Regex hex = HexDigit();
  return Concat({Times(hex, 8), L("-"), Times(hex, 4), L("-"), Times(hex, 4), L("-"), Times(hex, 4),
                 L("-"), Times(hex, 12)});
}

Regex Ipv4Regex() {
  const Regex octet =
      Alt({Concat({L("25"), Range('0', '5')}), Concat({L("2"), Range('0', '4'), Digit()}),
           Concat({L("1"), Digit(), Digit()}), Concat({Range('1', '9'), Digit()}), Digit()});
  return Concat({octet, L("."), octet, L("."), octet, L("."), octet});
}

CodePointSet AlnumSet() {
  CodePointSet alnum = CodePointSet::Range('0', '9');
  alnum.Add('a', 'z');
  alnum.Add('A', 'Z');
  return alnum;
}

// RFC 5322 dot-atom local part; a domain of at least two LDH labels.
Regex EmailRegex() {
  const CodePointSet alnum = AlnumSet();
  CodePointSet atext = alnum;
  atext.AddSet(SetOf("!#$%&'*+/=?^_`{|}~-"));
  const Regex atom = Plus(Class(atext));
  CodePointSet ldh = alnum;
  ldh.Add('-', '-');
  const Regex label = Concat({Class(alnum), Optional(Concat({Star(Class(ldh)), Class(alnum)}))});
  return Concat({atom, Star(Concat({L("."), atom})), L("@"), label, Plus(Concat({L("."), label}))});
}

// Loose: a scheme, then unreserved, reserved and %-encoded characters, one optional fragment.
Regex UriRegex() {
  const CodePointSet alnum = AlnumSet();
  CodePointSet scheme_char = alnum;
  scheme_char.AddSet(SetOf("+-."));
  CodePointSet uri_char = alnum;
  uri_char.AddSet(SetOf("-._~:/?@!$&'()*+,;="));
  const Regex uchar = Alt({Class(uri_char), Concat({L("%"), HexDigit(), HexDigit()})});
  CodePointSet alpha = CodePointSet::Range('a', 'z');
  alpha.Add('A', 'Z');
  return Concat({Class(alpha), Star(Class(scheme_char)), L(":"), Plus(uchar),
                 Optional(Concat({L("#"), Star(uchar)}))});
}

}  // namespace

std::optional<StringFormat> FindStringFormat(const std::string& name) {
  if (name == "date") return StringFormat{DateRegex(), 10, 10};
  if (name == "time") return StringFormat{TimeRegex(), 9};
  if (name == "date-time") return StringFormat{Concat({DateRegex(), L("T"), TimeRegex()}), 20};
  if (name == "uuid") return StringFormat{UuidRegex(), 36, 36};
  if (name == "ipv4") return StringFormat{Ipv4Regex(), 7, 15};
  if (name == "email") return StringFormat{EmailRegex(), 5};
  if (name == "uri") return StringFormat{UriRegex(), 3};
  return std::nullopt;
}

}  // namespace kvrm::structured
