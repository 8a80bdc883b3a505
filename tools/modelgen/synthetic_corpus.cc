#include "tools/modelgen/synthetic_corpus.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tools/modelgen/prng.h"

namespace kvrm::modelgen {
namespace {

constexpr const char* kOnsets[] = {
    "",   "",   "",   "b",  "c",  "d",  "f",  "g",  "h",  "j",  "k",  "l",  "m",  "n",
    "p",  "r",  "s",  "t",  "v",  "w",  "z",  "br", "cr", "dr", "fl", "gr", "pl", "pr",
    "st", "tr", "ch", "sh", "th", "qu", "sk", "sl", "sp", "bl", "cl", "gl", "sn", "wh"};
constexpr const char* kVowels[] = {"a",  "e",  "i",  "o",  "u",  "a",  "e",  "o",
                                        "ai", "ea", "ou", "io", "ee", "oo", "y",  "ie"};
constexpr const char* kCodas[] = {"",   "",   "",   "",   "n",  "r",  "s",  "t",  "l",
                                       "m",  "nd", "st", "rt", "ck", "ng", "x",  "th", "sh",
                                       "ll", "ss", "rn", "mp", "nt", "ft", "lk", "rd"};
// Accented vowels (two UTF-8 bytes each) for the Latin-1 flavoured words.
constexpr const char* kAccented[] = {"é", "è", "à", "ü", "ö", "ñ", "ç", "á", "í", "ó",
                                          "ú", "â", "ê", "ô", "ß", "ø", "å", "æ"};
// Common CJK characters (three UTF-8 bytes each).
constexpr const char* kCjk[] = {"日", "本", "語", "中", "文", "字", "人", "大", "小",
                                     "山", "川", "水", "火", "木", "金", "土", "上", "下",
                                     "口", "目", "手", "心", "学", "生", "国", "年", "時",
                                     "間", "東", "京", "電", "車", "天", "気", "雨", "花"};
constexpr const char* kCodeNames[] = {"x", "i", "n", "buf", "len", "self", "data", "out",
                                           "value", "count", "index", "result"};

// Real English, repeated through the corpus so its words and phrases become tokens.
constexpr const char* kEnglish[] = {
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of "
    "times, it was the age of wisdom, it was the age of foolishness.",
    "A language model reads a sequence of tokens and predicts the next one. The server keeps a "
    "cache of keys and values for every request, so that each new token costs only one step.",
    "In the beginning there was nothing but water and sky. Then the mountains rose, the rivers "
    "found their way to the sea, and people built houses along the shore.",
    "Please don't forget: we'll meet at 10:30 on Monday, and you're bringing the maps. I've "
    "already told them that it's going to rain, but they'd rather walk than drive.",
    "Numbers matter: 3.14159 is close to pi, 2.71828 is close to e, and 1,000,000 is a million. "
    "The year 2024 had 366 days; the year 2023 had 365.",
};

class Generator {
 public:
  explicit Generator(const CorpusOptions& options) : options_(options), rng_(options.seed) {
    BuildLexicon();
  }

  std::string Run() {
    std::string out;
    out.reserve(options_.target_bytes + 4096);
    while (out.size() < options_.target_bytes) Paragraph(&out);
    return out;
  }

 private:
  std::string Syllable() {
    return absl::StrCat(kOnsets[rng_.Below(std::size(kOnsets))],
                        kVowels[rng_.Below(std::size(kVowels))],
                        kCodas[rng_.Below(std::size(kCodas))]);
  }

  std::string NewWord() {
    const double r = rng_.Uniform();
    std::string w;
    if (r < 0.06) {  // accented Latin
      w = Syllable();
      w.insert(rng_.Below(static_cast<uint32_t>(w.size()) + 1),
               kAccented[rng_.Below(std::size(kAccented))]);
      w += Syllable();
    } else if (r < 0.09) {  // CJK
      const int n = 1 + rng_.Below(3);
      for (int i = 0; i < n; ++i) w += kCjk[rng_.Below(std::size(kCjk))];
    } else {
      const double s = rng_.Uniform();
      const int syllables = s < 0.25 ? 1 : s < 0.65 ? 2 : s < 0.9 ? 3 : 4;
      for (int i = 0; i < syllables; ++i) w += Syllable();
    }
    return w;
  }

  void BuildLexicon() {
    absl::flat_hash_set<std::string> seen;
    while (static_cast<int>(lexicon_.size()) < options_.lexicon_size) {
      std::string w = NewWord();
      if (seen.insert(w).second) lexicon_.push_back(std::move(w));
    }
    // Frequent words are short, as in natural languages (Zipf's law of abbreviation): without
    // this, early merges would glue whole long words instead of learning sub-word units.
    std::stable_sort(lexicon_.begin(), lexicon_.end(),
                     [](const std::string& a, const std::string& b) { return a.size() < b.size(); });
    // Zipf-like: weight of rank r is 1 / (r + 2.7); cumulative for inverse-CDF sampling.
    cdf_.resize(lexicon_.size());
    double total = 0;
    for (size_t r = 0; r < lexicon_.size(); ++r) {
      total += 1.0 / (static_cast<double>(r) + 2.7);
      cdf_[r] = total;
    }
    for (double& c : cdf_) c /= total;
  }

  const std::string& ZipfWord() {
    const double u = rng_.Uniform();
    const size_t r = std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return lexicon_[std::min(r, lexicon_.size() - 1)];
  }

  std::string Number() {
    const double r = rng_.Uniform();
    if (r < 0.3) return absl::StrCat(rng_.Below(100));
    if (r < 0.5) return absl::StrCat(1900 + rng_.Below(130));
    if (r < 0.65) return absl::StrCat(rng_.Below(100), ".", rng_.Below(100));
    if (r < 0.75) return absl::StrCat(rng_.Below(24), ":", 10 + rng_.Below(50));
    if (r < 0.85) return absl::StrCat("$", rng_.Below(1000));
    if (r < 0.92) return absl::StrCat(rng_.Below(100), "%");
    return absl::StrCat(rng_.Below(1000000));
  }

  void Sentence(std::string* out) {
    const int n = 3 + rng_.Below(14);
    for (int i = 0; i < n; ++i) {
      if (i > 0) out->push_back(' ');
      if (rng_.Chance(0.04)) {
        *out += Number();
      } else {
        std::string w = ZipfWord();
        const double c = rng_.Uniform();
        if (i == 0 || c < 0.05) {
          if (!w.empty() && absl::ascii_islower(w[0])) w[0] = absl::ascii_toupper(w[0]);
        } else if (c < 0.06) {
          absl::AsciiStrToUpper(&w);
        }
        *out += w;
        const double p = rng_.Uniform();
        if (p < 0.03) {
          *out += "'s";
        } else if (p < 0.04) {
          *out += rng_.Chance(0.5) ? "'t" : "'ll";
        } else if (p < 0.05 && i + 1 < n) {
          *out += "-";
          *out += ZipfWord();
        }
      }
      if (i + 1 < n) {
        const double p = rng_.Uniform();
        if (p < 0.08) {
          out->push_back(',');
        } else if (p < 0.095) {
          *out += rng_.Chance(0.5) ? ";" : ":";
        } else if (p < 0.105) {
          *out += " (";
          *out += ZipfWord();
          out->push_back(')');
        } else if (p < 0.112) {
          *out += " \"";
          *out += ZipfWord();
          out->push_back('"');
        }
      }
    }
    const double e = rng_.Uniform();
    *out += e < 0.8 ? "." : e < 0.9 ? "?" : e < 0.97 ? "!" : "...";
  }

  void CodeLine(std::string* out) {
    const char* a = kCodeNames[rng_.Below(std::size(kCodeNames))];
    const char* b = kCodeNames[rng_.Below(std::size(kCodeNames))];
    switch (rng_.Below(4)) {
      case 0:
        absl::StrAppend(out, "    ", a, " = ", b, "[", rng_.Below(64), "];\n");
        break;
      case 1:
        absl::StrAppend(out, "    if (", a, " < ", rng_.Below(1000), ") {\n        return ", b,
                        ";\n    }\n");
        break;
      case 2:
        absl::StrAppend(out, "    ", a, " += ", ZipfWord(), "(", b, ", ", rng_.Below(10),
                        ");\n");
        break;
      default:
        absl::StrAppend(out, "    // ", ZipfWord(), " ", ZipfWord(), "\n");
        break;
    }
  }

  void Paragraph(std::string* out) {
    const double kind = rng_.Uniform();
    if (kind < 0.04) {
      *out += kEnglish[rng_.Below(std::size(kEnglish))];
    } else if (kind < 0.07) {
      absl::StrAppend(out, "def ", ZipfWord(), "(", kCodeNames[rng_.Below(std::size(kCodeNames))],
                      "):\n");
      const int lines = 1 + rng_.Below(5);
      for (int i = 0; i < lines; ++i) CodeLine(out);
    } else if (kind < 0.1) {
      const int items = 2 + rng_.Below(4);
      for (int i = 0; i < items; ++i) {
        absl::StrAppend(out, rng_.Chance(0.5) ? "- " : absl::StrCat(i + 1, ". "));
        Sentence(out);
        out->push_back('\n');
      }
    } else {
      const int sentences = 1 + rng_.Below(6);
      for (int i = 0; i < sentences; ++i) {
        if (i > 0) out->push_back(' ');
        Sentence(out);
      }
    }
    *out += rng_.Chance(0.7) ? "\n\n" : "\n";
  }

  CorpusOptions options_;
  Rng rng_;
  std::vector<std::string> lexicon_;
  std::vector<double> cdf_;
};

}  // namespace

std::string BuildSyntheticCorpus(const CorpusOptions& options) {
  return Generator(options).Run();
}

CorpusOptions CorpusOptionsForMerges(uint64_t seed, int num_merges) {
  CorpusOptions options;
  options.seed = seed;
  options.lexicon_size = std::max(1000, num_merges * 2);
  options.target_bytes = std::max<size_t>(64 << 10, static_cast<size_t>(num_merges) * 160);
  return options;
}

}  // namespace kvrm::modelgen
