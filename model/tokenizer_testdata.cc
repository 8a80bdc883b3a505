#include "model/tokenizer_testdata.h"

#include <zlib.h>

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

}  // namespace kvrm
