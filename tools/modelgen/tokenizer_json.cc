#include "tools/modelgen/tokenizer_json.h"

#include "nlohmann/json.hpp"
#include "tools/modelgen/pretokenizer.h"

namespace kvrm::modelgen {
namespace {

using OJson = nlohmann::ordered_json;

OJson SpecialTokenPiece(int type_id) {
  return {{"SpecialToken", {{"id", std::string(kSpecialTokens[kBosIndex])}, {"type_id", type_id}}}};
}

OJson SequencePiece(const char* id, int type_id) {
  return {{"Sequence", {{"id", id}, {"type_id", type_id}}}};
}

OJson PostProcessor(const BpeModel& bpe) {
  const std::string bos(kSpecialTokens[kBosIndex]);
  OJson p;
  p["type"] = "TemplateProcessing";
  p["single"] = OJson::array({SpecialTokenPiece(0), SequencePiece("A", 0)});
  p["pair"] = OJson::array(
      {SpecialTokenPiece(0), SequencePiece("A", 0), SpecialTokenPiece(1), SequencePiece("B", 1)});
  p["special_tokens"][bos] = {
      {"id", bos}, {"ids", {SpecialTokenId(bpe, kBosIndex)}}, {"tokens", {bos}}};
  return p;
}

OJson PreTokenizerJson() {
  OJson split;
  split["type"] = "Split";
  split["pattern"] = {{"Regex", std::string(kLlama3SplitPattern)}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  OJson byte_level;
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = true;
  byte_level["use_regex"] = false;
  return {{"type", "Sequence"}, {"pretokenizers", OJson::array({split, byte_level})}};
}

OJson BpeModelJson(const BpeModel& bpe) {
  OJson m;
  m["type"] = "BPE";
  m["dropout"] = nullptr;
  m["unk_token"] = nullptr;
  m["continuing_subword_prefix"] = nullptr;
  m["end_of_word_suffix"] = nullptr;
  m["fuse_unk"] = false;
  m["byte_fallback"] = false;
  m["ignore_merges"] = false;
  // Appended directly: ordered_json's operator[] searches linearly, quadratic for 32k keys.
  // Keys are unique because the trainer never creates a token twice.
  OJson vocab = OJson::object();
  auto& entries = vocab.get_ref<OJson::object_t&>();
  entries.reserve(bpe.tokens.size());
  for (size_t id = 0; id < bpe.tokens.size(); ++id) {
    entries.std::vector<OJson::object_t::value_type>::emplace_back(ToByteLevel(bpe.tokens[id]),
                                                                    OJson(id));
  }
  m["vocab"] = std::move(vocab);
  OJson merges = OJson::array();
  for (const auto& [a, b] : bpe.merges) {
    merges.push_back(ToByteLevel(bpe.tokens[a]) + " " + ToByteLevel(bpe.tokens[b]));
  }
  m["merges"] = std::move(merges);
  return m;
}

}  // namespace

std::string BuildTokenizerJson(const BpeModel& bpe) {
  OJson added = OJson::array();
  for (size_t i = 0; i < kSpecialTokens.size(); ++i) {
    OJson t;
    t["id"] = SpecialTokenId(bpe, static_cast<int>(i));
    t["content"] = std::string(kSpecialTokens[i]);
    t["single_word"] = false;
    t["lstrip"] = false;
    t["rstrip"] = false;
    t["normalized"] = false;
    t["special"] = true;
    added.push_back(std::move(t));
  }
  OJson decoder;
  decoder["type"] = "ByteLevel";
  decoder["add_prefix_space"] = true;
  decoder["trim_offsets"] = true;
  decoder["use_regex"] = true;

  OJson root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = std::move(added);
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = PreTokenizerJson();
  root["post_processor"] = PostProcessor(bpe);
  root["decoder"] = std::move(decoder);
  root["model"] = BpeModelJson(bpe);
  return root.dump(2) + "\n";
}

std::string BuildTokenizerConfigJson(const BpeModel& bpe, int model_max_length) {
  OJson decoder_entries = OJson::object();
  for (size_t i = 0; i < kSpecialTokens.size(); ++i) {
    decoder_entries[std::to_string(SpecialTokenId(bpe, static_cast<int>(i)))] = {
        {"content", std::string(kSpecialTokens[i])},
        {"lstrip", false},
        {"normalized", false},
        {"rstrip", false},
        {"single_word", false},
        {"special", true}};
  }
  OJson c;
  c["added_tokens_decoder"] = std::move(decoder_entries);
  c["bos_token"] = std::string(kSpecialTokens[kBosIndex]);
  c["chat_template"] = std::string(kChatTemplate);
  // False: Transformers' clean-up would drop spaces before punctuation, breaking round trips.
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = std::string(kSpecialTokens[kEosIndex]);
  c["model_input_names"] = {"input_ids", "attention_mask"};
  c["model_max_length"] = model_max_length;
  c["pad_token"] = std::string(kSpecialTokens[kPadIndex]);
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  return c.dump(2) + "\n";
}

}  // namespace kvrm::modelgen
