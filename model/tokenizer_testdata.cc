#include "model/tokenizer_testdata.h"

#include <zlib.h>

#include "unicode/normalizer2.h"
#include "unicode/unistr.h"

namespace kvrm {

std::string ReadMaybeGzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files unchanged
  if (f == nullptr) return "";
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

std::string TestdataTokenizerJson(const std::string& family) {
  const std::string base = std::string(kTokenizerTestdata) + family + "/tokenizer.json";
  std::string text = ReadMaybeGzipped(base);
  return text.empty() ? ReadMaybeGzipped(base + ".gz") : text;
}

std::string Nfc(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  std::string out;
  n->normalize(icu::UnicodeString::fromUTF8(s), err).toUTF8String(out);
  return out;
}

}  // namespace kvrm
