#include "runtime/model_bundle.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/classifier_head.h"
#include "model/harmony.h"

namespace kvrm {

namespace {

// The GGUF file `path` names: itself when it is a file; the one .gguf file of a directory that
// has no config.json; "" for a Hugging Face directory.
absl::StatusOr<std::string> GgufPath(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": neither a model directory nor a GGUF file"));
  }
  if (fs::exists(fs::path(path) / "config.json", ec)) return std::string();
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == ".gguf" && e.is_regular_file(ec)) found.push_back(e.path());
  }
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", found.size(), " GGUF files and no config.json (", found[0], ", ",
                     found[1], found.size() > 2 ? ", ..." : "", "): give the file's path"));
  }
  return found.empty() ? std::string() : found[0];
}

absl::StatusOr<std::unique_ptr<ModelBundle>> LoadGguf(const std::string& path,
                                                      const ModelBundle::LoadOptions& options) {
  auto bundle = std::make_unique<ModelBundle>();
  bundle->dir = path;
  bundle->name = std::filesystem::path(path).stem().string();
  GgufLoadOptions go;
  go.as_q8 = options.as_q8;
  go.mxfp4 = options.mxfp4;
  go.dequantized = options.dense;
  ASSIGN_OR_RETURN(bundle->gguf, LoadGgufModel(path, go));
  GgufModel& g = *bundle->gguf;
  bundle->config = g.config;
  bundle->weights = g.weights;
  bundle->tokenizer = std::move(g.tokenizer);
  bundle->weights_format = "gguf " + g.file_type;
  bundle->chat.bos_token = g.bos_token;
  bundle->chat.eos_token = g.eos_token;
  if (!g.chat_template.empty()) {
    SetChatTemplate(g.chat_template, "tokenizer.chat_template", &bundle->chat);
  }
  return bundle;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBundle>> ModelBundle::Load(const std::string& path,
                                                               const LoadOptions& options) {
  ASSIGN_OR_RETURN(const std::string gguf, GgufPath(path));
  if (!gguf.empty()) return LoadGguf(gguf, options);
  const std::string& dir = path;
  auto bundle = std::make_unique<ModelBundle>();
  bundle->dir = dir;
  bundle->name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (bundle->name.empty()) {
    bundle->name = std::filesystem::path(dir).lexically_normal().parent_path().filename();
  }
  ASSIGN_OR_RETURN(bundle->config, LoadLlamaConfig(dir));
  ASSIGN_OR_RETURN(bundle->files, SafetensorsSet::OpenDirectory(dir));
  QuantizedCheckpointLoad quantized;
  quantized.options.as_q8 = options.as_q8 && (!bundle->config.quantization.NonIntegerValues() ||
                                              options.requantize_non_integer);
  quantized.options.dense = options.dense;
  quantized.options.requantize_as = options.requantize_as;
  quantized.options.mxfp4 = options.mxfp4;
  quantized.converted = &bundle->converted;
  QuantizedLoadStats stats;
  quantized.stats = &stats;
  ASSIGN_OR_RETURN(bundle->weights, BindLlamaWeights(bundle->config, *bundle->files, &quantized));
  // A head kvrm cannot follow leaves the rest served (Classify and Score say why).
  if (absl::StatusOr<std::optional<ClassifierHead>> head =
          LoadClassifierHead(dir, *bundle->files, bundle->config.hidden_size);
      head.ok()) {
    bundle->classifier = *std::move(head);
  } else {
    bundle->classifier_error = std::string(head.status().message());
    LOG(WARNING) << "Classify and Score refused: " << bundle->classifier_error;
  }
  if (const CheckpointQuantization& q = bundle->config.quantization; q.enabled()) {
    bundle->weights_format = q.Describe();
    // "awq 4-bit g128 checkpoint: 196 matrices as exactly their values (196 as 4-bit groups,
    // 0 as 8-bit blocks), 0 requantized to q8_0".
    const bool blocks = quantized.options.as_q8;
    std::string exact = absl::StrCat(stats.exact, " matrices as exactly their values");
    if (stats.exact > 0) {
      absl::StrAppend(&exact, blocks ? absl::StrCat(" (", stats.q4_groups, " as 4-bit groups, ",
                                                    stats.mxfp4, " as MXFP4 blocks, ",
                                                    stats.exact - stats.q4_groups - stats.mxfp4,
                                                    " as 8-bit blocks)")
                                     : std::string(" (f32)"));
    }
    const char* rounded = !blocks ? " rounded to bf16"
                          : options.requantize_as == WeightFormat::kQ4K
                              ? " requantized to q4_K (q8_0 where rows are no whole 256-value "
                                "blocks)"
                              : " requantized to q8_0";
    const char* why = stats.requantized == 0 || !blocks ? ""
                      : q.NonIntegerValues()
                          ? " (FP8 / NF4 / FP4 values are not 8-bit integers)"
                          : " (act-order or groups not a multiple of 32 input features)";
    LOG(INFO) << dir << ": " << bundle->weights_format << " checkpoint: " << exact << ", "
              << stats.requantized << rounded << why;
    if (q.activations_quantized) {
      LOG(INFO) << dir << ": the checkpoint was calibrated with quantized activations too "
                << "(W8A8 / FP8); kvrm computes them as its kernels do and reads no input scales";
    }
  }
  // Every id is below config.json's vocab_size (the embedding's rows): the tokenizer checks it.
  ASSIGN_OR_RETURN(bundle->tokenizer,
                   Tokenizer::FromFile(dir + "/tokenizer.json", bundle->config.vocab_size));
  ASSIGN_OR_RETURN(bundle->chat, LoadChatConfig(dir));
  // Transformers' LlamaTokenizer and LlamaTokenizerFast (Llama 2, Mistral v0.1-v0.2, CodeLlama,
  // TinyLlama) rebuild the post-processor when they load: BOS unless add_bos_token is false, EOS
  // when add_eos_token is true, whatever tokenizer.json's post_processor says. Prompts here are
  // encoded as theirs are.
  static constexpr std::string_view kLlamaTokenizers[] = {
      "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"};
  const ChatConfig& chat = bundle->chat;
  if (std::find(std::begin(kLlamaTokenizers), std::end(kLlamaTokenizers), chat.tokenizer_class) !=
      std::end(kLlamaTokenizers)) {
    const bool add_bos = chat.add_bos_token.value_or(true);
    const bool add_eos = chat.add_eos_token.value_or(false);
    // The class's defaults where tokenizer_config.json names no token ("<s>", "</s>"). A token
    // it names must be in the vocabulary; a default that is not leaves tokenizer.json's
    // post-processor as it is.
    const std::string bos = chat.bos_token.empty() ? "<s>" : chat.bos_token;
    const std::string eos = chat.eos_token.empty() ? "</s>" : chat.eos_token;
    const bool defaults_missing =
        (add_bos && chat.bos_token.empty() && !bundle->tokenizer->TokenToId(bos)) ||
        (add_eos && chat.eos_token.empty() && !bundle->tokenizer->TokenToId(eos));
    if (defaults_missing) {
      LOG(WARNING) << dir << "/tokenizer_config.json (" << chat.tokenizer_class
                   << ") names no bos_token / eos_token and the vocabulary has no <s> / </s>: "
                      "tokenizer.json's post-processor is kept";
    } else if (absl::Status st = bundle->tokenizer->SetSpecialTokensTemplate(
                   add_bos ? std::optional<std::string_view>(bos) : std::nullopt,
                   add_eos ? std::optional<std::string_view>(eos) : std::nullopt);
               !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/tokenizer_config.json (", chat.tokenizer_class, "): ", st.message()));
    }
  }
  return bundle;
}

std::vector<std::optional<std::string>> StructuredTokenBytes(const ModelBundle& model) {
  std::vector<std::optional<std::string>> bytes = model.tokenizer->TokenContinuationBytes();
  bytes.resize(model.config.vocab_size);
  // gpt-oss's message markers are special tokens that spell themselves (a constraint behind its
  // analysis, structured::HarmonyPrefix, writes them); not <|return|> or <|call|>, which end.
  if (model.chat.reasoning_format == ReasoningFormat::kHarmony) {
    for (std::string_view marker : kHarmonyMarkers) {
      const std::optional<int32_t> id = model.tokenizer->TokenToId(marker);
      if (id && *id < model.config.vocab_size && model.tokenizer->IsSpecial(*id)) {
        bytes[*id] = std::string(marker);
      }
    }
  }
  for (int32_t id : model.config.eos_token_ids) {
    if (id >= 0 && id < model.config.vocab_size) bytes[id].reset();
  }
  return bytes;
}

}  // namespace kvrm
