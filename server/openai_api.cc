#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace openai_json {

absl::Status Bad(absl::string_view param, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", why));
}

// OpenAI clients send null for parameters they leave unset: null is "absent" everywhere.
const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {

const char* TypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::binary: return "binary";
    case Json::value_t::discarded: return "invalid";
    default: return "a number";
  }
}

}  // namespace

absl::Status WrongType(absl::string_view param, absl::string_view want, const Json& got) {
  return Bad(param, absl::StrCat("must be ", want, ", not ", TypeName(got)));
}

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace openai_json

namespace {

using openai_json::Bad;
using openai_json::Dump;
using openai_json::Find;
using openai_json::WrongType;

absl::StatusOr<std::optional<double>> GetNumber(const Json& o, const char* key) {
  const Json* j = Find(o, key);
  if (j == nullptr) return std::optional<double>();
  if (!j->is_number()) return WrongType(key, "a number", *j);
  return std::optional<double>(j->get<double>());
}

// An integer; 3.0 is taken as 3 (JavaScript clients cannot tell them apart).
absl::StatusOr<std::optional<int64_t>> IntegerOf(const Json& j, absl::string_view param) {
  // Above INT64_MAX: refused, not wrapped to a negative value.
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Bad(param, absl::StrCat(j.get<uint64_t>(), " is out of range"));
  }
  if (j.is_number_integer()) return std::optional<int64_t>(j.get<int64_t>());
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) {
      return std::optional<int64_t>(static_cast<int64_t>(v));
    }
  }
  return WrongType(param, "an integer", j);
}

absl::StatusOr<std::optional<int64_t>> GetInt(const Json& o, const char* key) {
  const Json* j = Find(o, key);
  if (j == nullptr) return std::optional<int64_t>();
  return IntegerOf(*j, key);
}

// Within int32 (the proto's range; validation then checks the real bounds).
absl::StatusOr<std::optional<int32_t>> GetInt32(const Json& o, const char* key) {
  ASSIGN_OR_RETURN(std::optional<int64_t> v, GetInt(o, key));
  if (!v) return std::optional<int32_t>();
  if (*v < INT32_MIN || *v > INT32_MAX) return Bad(key, absl::StrCat(*v, " is out of range"));
  return std::optional<int32_t>(static_cast<int32_t>(*v));
}

// `parent` is the path of a nested object `o` ("messages[0]"), for the parameter's name.
std::string ParamName(absl::string_view parent, const char* key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

absl::StatusOr<std::optional<bool>> GetBool(const Json& o, const char* key,
                                            absl::string_view parent = "") {
  const Json* j = Find(o, key);
  if (j == nullptr) return std::optional<bool>();
  if (!j->is_boolean()) return WrongType(ParamName(parent, key), "a boolean", *j);
  return std::optional<bool>(j->get<bool>());
}

absl::StatusOr<std::optional<std::string>> GetString(const Json& o, const char* key,
                                                     absl::string_view parent = "") {
  const Json* j = Find(o, key);
  if (j == nullptr) return std::optional<std::string>();
  if (!j->is_string()) return WrongType(ParamName(parent, key), "a string", *j);
  return std::optional<std::string>(j->get<std::string>());
}

// The body again with its objects' keys in document order (Json sorts them), for the values
// passed on as JSON text: a schema's properties are generated in the order they are written
// ("reasoning" before "answer"), and a template shows tools and arguments as sent. Null where
// the body has none of them (or, which cannot happen after Json parsed it, does not parse).
std::optional<OrderedJson> OrderedBody(absl::string_view body) {
  for (const char* key : {"\"schema\"", "\"guided_json\"", "\"structured_outputs\"",
                          "\"grammar\"", "\"parameters\"", "\"arguments\""}) {
    if (!absl::StrContains(body, key)) continue;
    absl::StatusOr<OrderedJson> j =
        ParseOrderedJson(std::string_view(body.data(), body.size()), "request body");
    if (j.ok() && j->is_object()) return *std::move(j);
    break;
  }
  return std::nullopt;
}

// The ordered body's node at a key or an index of `o` (null when absent or `o` is null).
const OrderedJson* At(const OrderedJson* o, const char* key) {
  if (o == nullptr || !o->is_object()) return nullptr;
  auto it = o->find(key);
  return it == o->end() ? nullptr : &*it;
}
const OrderedJson* At(const OrderedJson* o, size_t index) {
  if (o == nullptr || !o->is_array() || index >= o->size()) return nullptr;
  return &(*o)[index];
}

// A JSON value that may come as an object or as its text (guided_json, tool arguments); an
// object is written from `ordered` (the same value, keys in document order) when there is one.
absl::StatusOr<std::string> JsonText(const Json& j, const OrderedJson* ordered,
                                     absl::string_view param) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) return ordered != nullptr && ordered->is_object() ? ordered->dump() : j.dump();
  return WrongType(param, "an object or a JSON string", j);
}

// The token ids of the array at `key` (absent: none) appended to `out`; errors name
// "key[i]" (not an integer) or `key` (outside int32; the service checks the vocabulary).
absl::Status TokenIds(const Json& body, const char* key,
                      google::protobuf::RepeatedField<int32_t>* out) {
  const Json* ids = Find(body, key);
  if (ids == nullptr) return absl::OkStatus();
  if (!ids->is_array()) return WrongType(key, "an array", *ids);
  for (size_t i = 0; i < ids->size(); ++i) {
    ASSIGN_OR_RETURN(std::optional<int64_t> id,
                     IntegerOf((*ids)[i], absl::StrCat(key, "[", i, "]")));
    if (*id < INT32_MIN || *id > INT32_MAX) return Bad(key, "id out of range");
    out->Add(static_cast<int32_t>(*id));
  }
  return absl::OkStatus();
}

// One GenerateRequest field set from a parameter, recorded for error messages.
class Builder {
 public:
  Builder(OpenAiRequest* out, const Json& body, const OrderedJson* ordered)
      : out_(out), body_(body), ordered_(ordered) {}

  v1::GenerateRequest& g() { return out_->generate; }
  void Param(const std::string& field, const std::string& param) { out_->params[field] = param; }

  // The common sampling and stopping parameters of both endpoints.
  absl::Status Sampling() {
    v1::SamplingParams* s = g().mutable_sampling();
    ASSIGN_OR_RETURN(std::optional<double> temperature, GetNumber(body_, "temperature"));
    s->set_temperature(temperature ? static_cast<float>(*temperature) : 1.0f);  // OpenAI's default
    Param("sampling.temperature", "temperature");
    ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumber(body_, "top_p"));
    if (top_p) s->set_top_p(static_cast<float>(*top_p));
    Param("sampling.top_p", "top_p");
    ASSIGN_OR_RETURN(std::optional<int32_t> top_k, GetInt32(body_, "top_k"));
    if (top_k) s->set_top_k(*top_k == -1 ? 0 : *top_k);  // vLLM: -1 is off
    Param("sampling.top_k", "top_k");
    ASSIGN_OR_RETURN(std::optional<double> min_p, GetNumber(body_, "min_p"));
    if (min_p) s->set_min_p(static_cast<float>(*min_p));
    Param("sampling.min_p", "min_p");
    ASSIGN_OR_RETURN(std::optional<double> rep, GetNumber(body_, "repetition_penalty"));
    if (rep) s->set_repetition_penalty(static_cast<float>(*rep));
    Param("sampling.repetition_penalty", "repetition_penalty");
    ASSIGN_OR_RETURN(std::optional<double> presence, GetNumber(body_, "presence_penalty"));
    if (presence) s->set_presence_penalty(static_cast<float>(*presence));
    Param("sampling.presence_penalty", "presence_penalty");
    ASSIGN_OR_RETURN(std::optional<double> frequency, GetNumber(body_, "frequency_penalty"));
    if (frequency) s->set_frequency_penalty(static_cast<float>(*frequency));
    Param("sampling.frequency_penalty", "frequency_penalty");
    const Json* seed_json = Find(body_, "seed");
    if (seed_json != nullptr && seed_json->is_number_unsigned()) {
      s->set_seed(seed_json->get<uint64_t>());  // the whole uint64 range
    } else {
      ASSIGN_OR_RETURN(std::optional<int64_t> seed, GetInt(body_, "seed"));
      if (seed) s->set_seed(static_cast<uint64_t>(*seed));  // negative seeds wrap, as numpy's do
    }
    if (const Json* bias = Find(body_, "logit_bias")) {
      if (!bias->is_object()) return WrongType("logit_bias", "an object", *bias);
      for (const auto& [key, value] : bias->items()) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) {
          return Bad("logit_bias", absl::StrCat("key \"", key, "\" is not a token id"));
        }
        if (!value.is_number()) {
          return WrongType(absl::StrCat("logit_bias.", key), "a number", value);
        }
        (*s->mutable_logit_bias())[id] = value.get<float>();
      }
    }
    Param("sampling.logit_bias", "logit_bias");
    RETURN_IF_ERROR(TokenIds(body_, "allowed_token_ids", s->mutable_allowed_token_ids()));
    Param("sampling.allowed_token_ids", "allowed_token_ids");
    if (const Json* bad = Find(body_, "bad_words")) {
      if (!bad->is_array()) return WrongType("bad_words", "an array of strings", *bad);
      for (size_t i = 0; i < bad->size(); ++i) {
        if (!(*bad)[i].is_string()) {
          return WrongType(absl::StrCat("bad_words[", i, "]"), "a string", (*bad)[i]);
        }
        s->add_bad_words((*bad)[i].get<std::string>());
      }
    }
    Param("sampling.bad_words", "bad_words");

    v1::StoppingCriteria* st = g().mutable_stopping();
    if (const Json* stop = Find(body_, "stop")) {
      if (stop->is_string()) {
        st->add_stop_sequences(stop->get<std::string>());
      } else if (stop->is_array()) {
        for (size_t i = 0; i < stop->size(); ++i) {
          if (!(*stop)[i].is_string()) {
            return WrongType(absl::StrCat("stop[", i, "]"), "a string", (*stop)[i]);
          }
          st->add_stop_sequences((*stop)[i].get<std::string>());
        }
      } else {
        return WrongType("stop", "a string or an array of strings", *stop);
      }
    }
    Param("stopping.stop_sequences", "stop");
    RETURN_IF_ERROR(TokenIds(body_, "stop_token_ids", st->mutable_stop_token_ids()));
    Param("stopping.stop_token_ids", "stop_token_ids");
    ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, GetBool(body_, "ignore_eos"));
    if (ignore_eos) st->set_ignore_eos(*ignore_eos);
    ASSIGN_OR_RETURN(std::optional<int32_t> min_tokens, GetInt32(body_, "min_tokens"));
    if (min_tokens) st->set_min_tokens(*min_tokens);
    Param("stopping.min_tokens", "min_tokens");
    ASSIGN_OR_RETURN(std::optional<bool> include_stop, GetBool(body_, "include_stop_str_in_output"));
    if (include_stop) st->set_include_stop_str_in_output(*include_stop);
    ASSIGN_OR_RETURN(std::optional<int32_t> truncate, GetInt32(body_, "truncate_prompt_tokens"));
    if (truncate) g().set_truncate_prompt_tokens(*truncate);
    Param("truncate_prompt_tokens", "truncate_prompt_tokens");

    ASSIGN_OR_RETURN(std::optional<int32_t> n, GetInt32(body_, "n"));
    if (n) g().set_n(*n);
    Param("n", "n");
    // vLLM's beam search: n beams, best first; length_penalty divides by length^penalty.
    ASSIGN_OR_RETURN(std::optional<bool> beam_search, GetBool(body_, "use_beam_search"));
    ASSIGN_OR_RETURN(std::optional<double> length_penalty, GetNumber(body_, "length_penalty"));
    if (beam_search.value_or(false)) {
      v1::BeamSearch* b = g().mutable_beam_search();
      if (length_penalty) b->set_length_penalty(static_cast<float>(*length_penalty));
    }
    Param("beam_search.length_penalty", "length_penalty");
    Param("beam_search", "use_beam_search");
    ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(body_, "stream"));
    out_->stream = stream.value_or(false);
    if (const Json* options = Find(body_, "stream_options")) {
      if (!options->is_object()) return WrongType("stream_options", "an object", *options);
      ASSIGN_OR_RETURN(std::optional<bool> usage,
                       GetBool(*options, "include_usage", "stream_options"));
      out_->include_usage = usage.value_or(false);
      ASSIGN_OR_RETURN(std::optional<bool> continuous,
                       GetBool(*options, "continuous_usage_stats", "stream_options"));
      out_->continuous_usage = continuous.value_or(false);
    }
    ASSIGN_OR_RETURN(std::optional<bool> token_ids, GetBool(body_, "return_token_ids"));
    out_->return_token_ids = token_ids.value_or(false);
    if (out_->return_token_ids) g().mutable_response()->set_prompt_token_ids(true);
    ASSIGN_OR_RETURN(std::optional<bool> as_ids, GetBool(body_, "return_tokens_as_token_ids"));
    out_->tokens_as_ids = as_ids.value_or(false);
    ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(body_, "model"));
    out_->model = model.value_or("");
    ASSIGN_OR_RETURN(std::optional<std::string> user, GetString(body_, "user"));  // not used
    (void)user;
    ASSIGN_OR_RETURN(std::optional<std::string> salt, GetString(body_, "cache_salt"));
    if (salt) g().set_cache_salt(*salt);
    Param("cache_salt", "cache_salt");
    ASSIGN_OR_RETURN(std::optional<int32_t> priority, GetInt32(body_, "priority"));
    if (priority) g().set_priority(*priority);
    Param("priority", "priority");
    ASSIGN_OR_RETURN(std::optional<std::string> request_id, GetString(body_, "request_id"));
    if (request_id) g().set_request_id(*request_id);
    Param("request_id", "request_id");
    return absl::OkStatus();
  }

  // max_tokens (and chat's max_completion_tokens, which wins when both are sent).
  absl::Status MaxTokens(int32_t fallback, bool chat) {
    ASSIGN_OR_RETURN(std::optional<int32_t> max_tokens, GetInt32(body_, "max_tokens"));
    std::optional<int32_t> max_completion;
    if (chat) {
      ASSIGN_OR_RETURN(max_completion, GetInt32(body_, "max_completion_tokens"));
    }
    if (max_completion) {
      g().mutable_stopping()->set_max_new_tokens(*max_completion);
      Param("stopping.max_new_tokens", "max_completion_tokens");
    } else {
      g().mutable_stopping()->set_max_new_tokens(max_tokens.value_or(fallback));
      Param("stopping.max_new_tokens", "max_tokens");
    }
    return absl::OkStatus();
  }

  // A list of strings into `out` (guided_choice, structured_outputs.choice).
  static absl::Status Choices(const Json& list, const std::string& param, v1::Choices* out) {
    if (!list.is_array()) return WrongType(param, "an array of strings", list);
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) {
        return WrongType(absl::StrCat(param, "[", i, "]"), "a string", list[i]);
      }
      out->add_choices(list[i].get<std::string>());
    }
    return absl::OkStatus();
  }

  // response_format, vLLM's guided_* parameters and structured_outputs, llama.cpp's grammar; at
  // most one of them.
  absl::Status Structured() {
    int set = 0;
    std::string from;
    v1::StructuredOutput structured;
    if (const Json* format = Find(body_, "response_format")) {
      if (!format->is_object()) return WrongType("response_format", "an object", *format);
      ASSIGN_OR_RETURN(std::optional<std::string> type,
                       GetString(*format, "type", "response_format"));
      const std::string t = type.value_or("");
      if (t == "json_object") {
        structured.set_json_object(true);
        ++set;
        from = "response_format";
      } else if (t == "json_schema") {
        const Json* spec = Find(*format, "json_schema");
        if (spec == nullptr || !spec->is_object()) {
          return Bad("response_format.json_schema", "an object with \"schema\" is required");
        }
        const Json* schema = Find(*spec, "schema");
        if (schema == nullptr) {
          return Bad("response_format.json_schema.schema", "is required");
        }
        ASSIGN_OR_RETURN(
            std::string text,
            JsonText(*schema, At(At(At(ordered_, "response_format"), "json_schema"), "schema"),
                     "response_format.json_schema.schema"));
        structured.set_json_schema(std::move(text));
        ++set;
        from = "response_format.json_schema.schema";
      } else if (t != "text") {
        return Bad("response_format.type",
                   absl::StrCat("\"", t, "\": use text, json_object or json_schema"));
      }
    }
    if (const Json* schema = Find(body_, "guided_json")) {
      ASSIGN_OR_RETURN(std::string text,
                       JsonText(*schema, At(ordered_, "guided_json"), "guided_json"));
      structured.set_json_schema(std::move(text));
      ++set;
      from = "guided_json";
    }
    ASSIGN_OR_RETURN(std::optional<std::string> regex, GetString(body_, "guided_regex"));
    if (regex) {
      structured.set_regex(*regex);
      ++set;
      from = "guided_regex";
    }
    if (const Json* choice = Find(body_, "guided_choice")) {
      RETURN_IF_ERROR(Choices(*choice, "guided_choice", structured.mutable_choice()));
      ++set;
      from = "guided_choice";
    }
    // vLLM's guided_grammar and llama.cpp server's grammar: GBNF.
    ASSIGN_OR_RETURN(std::optional<std::string> guided_grammar, GetString(body_, "guided_grammar"));
    if (guided_grammar) {
      structured.set_grammar(*guided_grammar);
      ++set;
      from = "guided_grammar";
    }
    // `grammar`: llama.cpp's GBNF text, or TGI's {"type": "json" | "regex", "value": ...}.
    if (const Json* grammar = Find(body_, "grammar")) {
      if (grammar->is_string()) {
        structured.set_grammar(grammar->get<std::string>());
      } else if (grammar->is_object()) {
        ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(*grammar, "type", "grammar"));
        const Json* value = Find(*grammar, "value");
        if (value == nullptr) return Bad("grammar.value", "is required");
        if (type.value_or("") == "json" || type.value_or("") == "json_schema") {
          ASSIGN_OR_RETURN(std::string text,
                           JsonText(*value, At(At(ordered_, "grammar"), "value"), "grammar.value"));
          structured.set_json_schema(std::move(text));
        } else if (type.value_or("") == "regex") {
          if (!value->is_string()) return WrongType("grammar.value", "a string", *value);
          structured.set_regex(value->get<std::string>());
        } else {
          return Bad("grammar.type",
                     absl::StrCat("\"", type.value_or(""), "\": use json, json_schema or regex"));
        }
      } else {
        return WrongType("grammar", "a GBNF string or an object with type and value", *grammar);
      }
      ++set;
      from = "grammar";
    }
    ASSIGN_OR_RETURN(std::optional<std::string> ws, GetString(body_, "guided_whitespace_pattern"));
    std::string ws_from = "guided_whitespace_pattern";
    // vLLM's structured_outputs (which replaces its guided_* parameters): one of json, regex,
    // choice, grammar or json_object, and whitespace_pattern.
    if (const Json* so = Find(body_, "structured_outputs")) {
      if (!so->is_object()) return WrongType("structured_outputs", "an object", *so);
      const OrderedJson* so_ordered = At(ordered_, "structured_outputs");
      int inner = 0;
      if (const Json* schema = Find(*so, "json")) {
        ASSIGN_OR_RETURN(std::string text,
                         JsonText(*schema, At(so_ordered, "json"), "structured_outputs.json"));
        structured.set_json_schema(std::move(text));
        ++inner;
        from = "structured_outputs.json";
      }
      ASSIGN_OR_RETURN(std::optional<std::string> so_regex,
                       GetString(*so, "regex", "structured_outputs"));
      if (so_regex) {
        structured.set_regex(*so_regex);
        ++inner;
        from = "structured_outputs.regex";
      }
      if (const Json* choice = Find(*so, "choice")) {
        RETURN_IF_ERROR(Choices(*choice, "structured_outputs.choice", structured.mutable_choice()));
        ++inner;
        from = "structured_outputs.choice";
      }
      ASSIGN_OR_RETURN(std::optional<std::string> so_grammar,
                       GetString(*so, "grammar", "structured_outputs"));
      if (so_grammar) {
        structured.set_grammar(*so_grammar);
        ++inner;
        from = "structured_outputs.grammar";
      }
      ASSIGN_OR_RETURN(std::optional<bool> object,
                       GetBool(*so, "json_object", "structured_outputs"));
      if (object.value_or(false)) {
        structured.set_json_object(true);
        ++inner;
        from = "structured_outputs.json_object";
      }
      if (Find(*so, "structural_tag") != nullptr) {
        return Bad("structured_outputs.structural_tag", "is not supported");
      }
      ASSIGN_OR_RETURN(std::optional<std::string> so_ws,
                       GetString(*so, "whitespace_pattern", "structured_outputs"));
      if (so_ws) {
        ws = so_ws;
        ws_from = "structured_outputs.whitespace_pattern";
      }
      if (inner == 0) {
        return Bad("structured_outputs", "set one of json, regex, choice, grammar or json_object");
      }
      set += inner;
    }
    if (set > 1) {
      return Bad(from,
                 "only one of response_format, guided_json, guided_regex, guided_choice, "
                 "guided_grammar, grammar and structured_outputs' json, regex, choice, "
                 "grammar and json_object may be given");
    }
    if (ws) {
      if (set == 0) return Bad(ws_from, "needs a JSON constraint");
      structured.set_whitespace_pattern(*ws);
    }
    if (set == 1) {
      *g().mutable_structured() = std::move(structured);
      for (const char* field :
           {"structured", "structured.regex", "structured.json_schema", "structured.json_object",
            "structured.choice", "structured.grammar"}) {
        Param(field, from);
      }
      Param("structured.whitespace_pattern", ws_from);
    }
    return absl::OkStatus();
  }

 private:
  OpenAiRequest* out_;
  const Json& body_;
  const OrderedJson* ordered_;  // the body with keys in document order, or null
};

// A list of token ids, or INVALID_ARGUMENT naming `param`.
absl::Status TokenList(const Json& list, const std::string& param,
                       google::protobuf::RepeatedField<int32_t>* out) {
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(param, "[", i, "]");
    ASSIGN_OR_RETURN(std::optional<int64_t> id, IntegerOf(list[i], at));
    if (*id < 0 || *id > INT32_MAX) return Bad(at, absl::StrCat(*id, " is not a token id"));
    out->Add(static_cast<int32_t>(*id));
  }
  return absl::OkStatus();
}

absl::Status CompletionPrompt(const Json& body, const OpenAiDefaults& defaults,
                              OpenAiRequest* out) {
  const Json* prompt = Find(body, "prompt");
  if (prompt == nullptr) return Bad("prompt", "is required");
  v1::GenerateRequest& g = out->generate;
  out->params["text"] = "prompt";
  out->params["token_ids"] = "prompt";
  out->params["prompt"] = "prompt";
  if (prompt->is_string()) {
    g.set_text(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt->is_array()) {
    return WrongType("prompt", "a string, an array of strings or of token ids", *prompt);
  }
  if (prompt->empty()) return Bad("prompt", "is empty");
  // [1, 2, 3] is one prompt of token ids; ["a"] and [[1, 2]] are lists of prompts.
  if ((*prompt)[0].is_number()) return TokenList(*prompt, "prompt", g.mutable_token_ids()->mutable_ids());
  // A list of prompts: one call each (OpenAiCalls), the first in `generate`, the rest in
  // `more_prompts`.
  if (static_cast<int64_t>(prompt->size()) > defaults.max_prompts) {
    return Bad("prompt", absl::StrCat("a list of ", prompt->size(), " prompts: at most ",
                                      defaults.max_prompts, " in one request"));
  }
  for (size_t p = 0; p < prompt->size(); ++p) {
    const Json& one = (*prompt)[p];
    const std::string at = absl::StrCat("prompt[", p, "]");
    v1::GenerateRequest* into = &g;
    if (p > 0) into = &out->more_prompts.emplace_back();
    if (one.is_string()) {
      into->set_text(one.get<std::string>());
    } else if (one.is_array()) {
      if (one.empty()) return Bad(at, "is empty");
      RETURN_IF_ERROR(TokenList(one, at, into->mutable_token_ids()->mutable_ids()));
    } else {
      return WrongType(at, "a string or an array of token ids", one);
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace openai_json {

absl::StatusOr<std::string> TextParts(const Json& content, const std::string& param,
                                      std::initializer_list<const char*> types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return WrongType(param, "a string or an array of parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = absl::StrCat(param, "[", i, "]");
    const Json& part = content[i];
    if (!part.is_object()) return WrongType(at, "an object", part);
    ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(part, "type", at));
    const std::string t = type.value_or("");
    if (std::none_of(types.begin(), types.end(), [&](const char* k) { return t == k; })) {
      return Bad(absl::StrCat(at, ".type"),
                 absl::StrCat("\"", t, "\" is not supported: this server's models take text only"));
    }
    const Json* value = Find(part, "text");
    if (value == nullptr || !value->is_string()) {
      return Bad(absl::StrCat(at, ".text"), "is required");
    }
    text += value->get<std::string>();  // parts are joined as vLLM joins them: without a separator
  }
  return text;
}

absl::StatusOr<std::string> RequiredString(const Json& o, const char* key, const std::string& at) {
  const Json* v = Find(o, key);
  if (v == nullptr) return Bad(absl::StrCat(at, ".", key), "is required");
  if (!v->is_string()) return WrongType(absl::StrCat(at, ".", key), "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<OpenAiRequest> ParseTranslatedChat(
    const OrderedJson& chat, const OpenAiDefaults& defaults,
    const std::function<std::string(const std::string&)>& rename) {
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, Dump(chat), defaults);
  if (!parsed.ok()) {
    // Named as the chat request spells it: say it as the caller's body does.
    const std::string message(parsed.status().message());
    const size_t colon = message.find(": ");
    if (colon == std::string::npos) return parsed.status();
    return absl::Status(parsed.status().code(),
                        absl::StrCat(rename(message.substr(0, colon)), message.substr(colon)));
  }
  for (auto& [field, param] : parsed->params) param = rename(param);
  return parsed;
}

}  // namespace openai_json

namespace {

absl::Status ChatMessages(const Json& body, const OrderedJson* ordered, OpenAiRequest* out) {
  const Json* messages = Find(body, "messages");
  if (messages == nullptr) return Bad("messages", "is required");
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  v1::ChatPrompt* chat = out->generate.mutable_chat();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string at = absl::StrCat("messages[", i, "]");
    const Json& m = (*messages)[i];
    if (!m.is_object()) return WrongType(at, "an object", m);
    v1::ChatMessage* msg = chat->add_messages();
    const Json* role = Find(m, "role");
    if (role == nullptr || !role->is_string()) return Bad(absl::StrCat(at, ".role"), "is required");
    msg->set_role(role->get<std::string>());
    if (const Json* content = Find(m, "content")) {
      ASSIGN_OR_RETURN(std::string text,
                       openai_json::TextParts(*content, absl::StrCat(at, ".content"), {"text"}));
      msg->set_content(std::move(text));
    }
    ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(m, "name", at));
    if (name) msg->set_name(*name);
    ASSIGN_OR_RETURN(std::optional<std::string> call_id, GetString(m, "tool_call_id", at));
    if (call_id) msg->set_tool_call_id(*call_id);
    // A past turn's reasoning, as vLLM takes it back (reasoning_content, or reasoning).
    ASSIGN_OR_RETURN(std::optional<std::string> reasoning, GetString(m, "reasoning_content", at));
    if (!reasoning) {
      ASSIGN_OR_RETURN(reasoning, GetString(m, "reasoning", at));
    }
    if (reasoning) msg->set_reasoning_content(*reasoning);
    if (const Json* calls = Find(m, "tool_calls")) {
      if (!calls->is_array()) return WrongType(absl::StrCat(at, ".tool_calls"), "an array", *calls);
      for (size_t c = 0; c < calls->size(); ++c) {
        const std::string cat = absl::StrCat(at, ".tool_calls[", c, "]");
        const Json& call = (*calls)[c];
        if (!call.is_object()) return WrongType(cat, "an object", call);
        const Json* fn = Find(call, "function");
        if (fn == nullptr || !fn->is_object()) {
          return Bad(absl::StrCat(cat, ".function"), "is required");
        }
        v1::ToolCall* tc = msg->add_tool_calls();
        ASSIGN_OR_RETURN(std::optional<std::string> id, GetString(call, "id", cat));
        if (id) tc->set_id(*id);
        const Json* fname = Find(*fn, "name");
        if (fname == nullptr || !fname->is_string()) {
          return Bad(absl::StrCat(cat, ".function.name"), "is required");
        }
        tc->set_name(fname->get<std::string>());
        if (const Json* args = Find(*fn, "arguments")) {
          const OrderedJson* ordered_args = At(
              At(At(At(At(At(ordered, "messages"), i), "tool_calls"), c), "function"), "arguments");
          ASSIGN_OR_RETURN(std::string text,
                           JsonText(*args, ordered_args, absl::StrCat(cat, ".function.arguments")));
          tc->set_arguments(std::move(text));
        }
      }
    }
  }
  out->params["chat.messages"] = "messages";
  out->params["chat"] = "messages";
  out->params["prompt"] = "messages";
  return absl::OkStatus();
}

absl::Status ChatTools(const Json& body, const OrderedJson* ordered, OpenAiRequest* out) {
  v1::ChatPrompt* chat = out->generate.mutable_chat();
  if (const Json* tools = Find(body, "tools")) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string at = absl::StrCat("tools[", i, "]");
      const Json& t = (*tools)[i];
      if (!t.is_object()) return WrongType(at, "an object", t);
      ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(t, "type", at));
      if (type.value_or("function") != "function") {
        return Bad(absl::StrCat(at, ".type"), absl::StrCat("\"", *type, "\": use function"));
      }
      const Json* fn = Find(t, "function");
      if (fn == nullptr || !fn->is_object()) return Bad(absl::StrCat(at, ".function"), "is required");
      v1::Tool* tool = chat->add_tools();
      const Json* name = Find(*fn, "name");
      if (name == nullptr || !name->is_string()) {
        return Bad(absl::StrCat(at, ".function.name"), "is required");
      }
      tool->set_name(name->get<std::string>());
      ASSIGN_OR_RETURN(std::optional<std::string> description,
                       GetString(*fn, "description", absl::StrCat(at, ".function")));
      if (description) tool->set_description(*description);
      if (const Json* parameters = Find(*fn, "parameters")) {
        ASSIGN_OR_RETURN(
            std::string text,
            JsonText(*parameters, At(At(At(At(ordered, "tools"), i), "function"), "parameters"),
                     absl::StrCat(at, ".function.parameters")));
        tool->set_parameters(std::move(text));
      }
    }
  }
  out->params["chat.tools"] = "tools";
  if (const Json* choice = Find(body, "tool_choice")) {
    v1::ToolChoice* tc = chat->mutable_tool_choice();
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "auto") {
        tc->set_mode(v1::TOOL_CHOICE_MODE_AUTO);
      } else if (mode == "none") {
        tc->set_mode(v1::TOOL_CHOICE_MODE_NONE);
      } else if (mode == "required") {
        tc->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
      } else {
        return Bad("tool_choice", absl::StrCat("\"", mode, "\": use auto, none, required or "
                                               "{\"type\": \"function\", ...}"));
      }
    } else if (choice->is_object()) {
      const Json* fn = Find(*choice, "function");
      const Json* name = fn != nullptr && fn->is_object() ? Find(*fn, "name") : nullptr;
      if (name == nullptr || !name->is_string()) {
        return Bad("tool_choice.function.name", "is required");
      }
      tc->set_function(name->get<std::string>());
    } else {
      return WrongType("tool_choice", "a string or an object", *choice);
    }
  }
  out->params["chat.tool_choice"] = "tool_choice";
  ASSIGN_OR_RETURN(std::optional<bool> parallel, GetBool(body, "parallel_tool_calls"));
  if (parallel) chat->set_parallel_tool_calls(*parallel);
  return absl::OkStatus();
}

absl::Status ChatOptions(const Json& body, OpenAiRequest* out) {
  v1::ChatPrompt* chat = out->generate.mutable_chat();
  ASSIGN_OR_RETURN(std::optional<bool> add, GetBool(body, "add_generation_prompt"));
  if (add) chat->set_add_generation_prompt(*add);
  ASSIGN_OR_RETURN(std::optional<bool> cont, GetBool(body, "continue_final_message"));
  if (cont) chat->set_continue_final_message(*cont);
  out->params["chat.continue_final_message"] = "continue_final_message";
  Json kwargs_object = Json::object();
  if (const Json* kwargs = Find(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    kwargs_object = *kwargs;
  }
  // OpenAI's reasoning_effort reaches the template as the variable of that name (gpt-oss's
  // writes "Reasoning: low / medium / high" into its system message), as vLLM passes it;
  // chat_template_kwargs' own reasoning_effort wins.
  if (const Json* effort = Find(body, "reasoning_effort");
      effort != nullptr && !effort->is_null()) {
    if (!effort->is_string()) return WrongType("reasoning_effort", "a string", *effort);
    const std::string e = effort->get<std::string>();
    if (e != "low" && e != "medium" && e != "high") {  // the levels gpt-oss knows
      return Bad("reasoning_effort", absl::StrCat("\"", e, "\": use low, medium or high"));
    }
    if (!kwargs_object.contains("reasoning_effort")) kwargs_object["reasoning_effort"] = e;
  }
  if (!kwargs_object.empty()) chat->set_template_kwargs(kwargs_object.dump());
  out->params["chat.template_kwargs"] = "chat_template_kwargs";
  ASSIGN_OR_RETURN(std::optional<int32_t> budget, GetInt32(body, "thinking_token_budget"));
  if (budget) chat->set_thinking_budget(*budget);
  out->params["chat.thinking_budget"] = "thinking_token_budget";
  ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(body, "logprobs"));
  ASSIGN_OR_RETURN(std::optional<int32_t> top, GetInt32(body, "top_logprobs"));
  if (top && !logprobs.value_or(false)) return Bad("top_logprobs", "needs logprobs: true");
  if (logprobs.value_or(false)) {
    out->logprobs = top.value_or(0);
    out->generate.mutable_response()->set_logprobs(true);
    out->generate.mutable_response()->set_top_logprobs(top.value_or(0));
  }
  out->params["response.top_logprobs"] = "top_logprobs";
  return absl::OkStatus();
}

absl::Status CompletionOptions(const Json& body, OpenAiRequest* out) {
  ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetString(body, "suffix"));
  if (suffix && !suffix->empty()) return Bad("suffix", "is not supported");
  ASSIGN_OR_RETURN(std::optional<int32_t> best_of, GetInt32(body, "best_of"));
  if (best_of && *best_of != std::max(1, out->generate.n())) {
    return Bad("best_of", "must equal n (completions are not ranked)");
  }
  ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(body, "echo"));
  out->echo = echo.value_or(false);
  ASSIGN_OR_RETURN(std::optional<int32_t> logprobs, GetInt32(body, "logprobs"));
  if (logprobs) {
    out->logprobs = *logprobs;
    out->generate.mutable_response()->set_logprobs(true);
    out->generate.mutable_response()->set_top_logprobs(*logprobs);
    if (out->echo) {
      // The prompt's tokens lead the logprobs object: they are scored too (lm-evaluation-
      // harness's log-likelihood requests are echo + logprobs).
      v1::ResponseOptions* ro = out->generate.mutable_response();
      ro->set_prompt_logprobs(true);
      ro->set_prompt_top_logprobs(std::max(ro->prompt_top_logprobs(), *logprobs));
    }
  }
  out->params["response.top_logprobs"] = "logprobs";
  ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(body, "add_special_tokens"));
  if (add_special) out->generate.set_skip_bos(!*add_special);
  return absl::OkStatus();
}

// One server-sent event.
std::string Sse(const std::string& data) { return absl::StrCat("data: ", data, "\n\n"); }

// `streamed_ids`: calls already streamed as deltas, which a stream's last chunk does not send
// again; the others take their own index, or the next one no streamed call used (a call that
// differs from what was streamed under its index comes again whole, under a fresh id).
OrderedJson OpenAiToolCalls(const v1::Finished& finished, bool with_index,
                            const std::set<std::string>& streamed_ids = {},
                            std::set<int32_t> used_indices = {}) {
  OrderedJson calls = OrderedJson::array();
  for (int i = 0; i < finished.tool_calls_size(); ++i) {
    const v1::ToolCall& c = finished.tool_calls(i);
    if (streamed_ids.count(c.id()) > 0) continue;
    OrderedJson call;
    if (with_index) {
      int32_t index = i;
      while (used_indices.count(index) > 0) ++index;
      used_indices.insert(index);
      call["index"] = index;
    }
    call["id"] = c.id();
    call["type"] = "function";
    call["function"] = {{"name", c.name()}, {"arguments", c.arguments()}};
    calls.push_back(std::move(call));
  }
  return calls;
}

OrderedJson StopReason(const v1::Finished& f) {
  if (!f.matched_stop().empty()) return f.matched_stop();
  return nullptr;
}

}  // namespace

// Parameters of OpenAI's or vLLM's API that this server cannot honour: refused by name rather
// than ignored, so that a client relying on one learns at once (unknown parameters are ignored,
// since SDKs send some that change nothing).
absl::Status RefuseUnsupported(const Json& body, bool chat) {
  ASSIGN_OR_RETURN(std::optional<bool> skip_special, GetBool(body, "skip_special_tokens"));
  if (!skip_special.value_or(true)) {
    return Bad("skip_special_tokens", "false is not supported: special tokens are left out of the text");
  }
  if (chat) {
    for (const char* key : {"functions", "function_call"}) {
      if (Find(body, key) != nullptr) return Bad(key, "is not supported: use tools and tool_choice");
    }
    if (Find(body, "chat_template") != nullptr) {
      return Bad("chat_template",
                 "per request is not supported: the server's is the model's or kvrmd --chat_template");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiDefaults& defaults) {
  absl::StatusOr<Json> parsed = ParseJson(std::string_view(body.data(), body.size()), "request body");
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (!parsed->is_object()) return WrongType("request body", "a JSON object", *parsed);
  OpenAiRequest out;
  out.endpoint = endpoint;
  const std::optional<OrderedJson> ordered = OrderedBody(body);
  const OrderedJson* ordered_root = ordered ? &*ordered : nullptr;
  Builder b(&out, *parsed, ordered_root);
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  RETURN_IF_ERROR(RefuseUnsupported(*parsed, chat));
  {
    // vLLM's prompt_logprobs (null: off; 0: the prompt tokens' own logprobs only).
    ASSIGN_OR_RETURN(std::optional<int32_t> plp, GetInt32(*parsed, "prompt_logprobs"));
    if (plp) {
      // (Its range, [0, 20], is the service's check, reported under this name.)
      out.prompt_logprobs = *plp;
      v1::ResponseOptions* ro = out.generate.mutable_response();
      ro->set_prompt_logprobs(true);
      ro->set_prompt_top_logprobs(*plp);
      out.params["response.prompt_top_logprobs"] = "prompt_logprobs";
    }
  }
  RETURN_IF_ERROR(b.Sampling());
  RETURN_IF_ERROR(
      b.MaxTokens(chat ? defaults.chat_max_tokens : defaults.completion_max_tokens, chat));
  RETURN_IF_ERROR(b.Structured());
  if (chat) {
    RETURN_IF_ERROR(ChatMessages(*parsed, ordered_root, &out));
    RETURN_IF_ERROR(ChatTools(*parsed, ordered_root, &out));
    RETURN_IF_ERROR(ChatOptions(*parsed, &out));
  } else {
    RETURN_IF_ERROR(CompletionPrompt(*parsed, defaults, &out));
    RETURN_IF_ERROR(CompletionOptions(*parsed, &out));
  }
  // Bounded here, before the reply is sized from them (the service checks n again).
  const int32_t n = out.generate.n();
  if (n < 0 || n > defaults.max_n) {
    return Bad("n", absl::StrCat(n, " is outside [1, ", defaults.max_n, "]"));
  }
  const int64_t choices = static_cast<int64_t>(std::max(1, n)) * (1 + out.more_prompts.size());
  if (choices > defaults.max_choices) {
    return Bad("n", absl::StrCat(choices, " completions (prompts times n); at most ",
                                 defaults.max_choices, " in one request"));
  }
  return out;
}

namespace {

absl::StatusOr<Json> ParseBody(absl::string_view body) {
  absl::StatusOr<Json> parsed = ParseJson(std::string_view(body.data(), body.size()), "request body");
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (!parsed->is_object()) return WrongType("request body", "a JSON object", *parsed);
  return parsed;
}

}  // namespace

absl::StatusOr<OpenAiTokenize> ParseTokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(Json parsed, ParseBody(body));
  OpenAiTokenize out;
  if (Find(parsed, "messages") != nullptr) {
    // The chat prompt exactly as /v1/chat/completions renders it.
    ASSIGN_OR_RETURN(out.request, ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body, {}));
    *out.tokenize.mutable_chat() = out.request.generate.chat();
  } else {
    out.request.endpoint = OpenAiEndpoint::kCompletions;
    ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(parsed, "model"));
    if (model) out.request.model = *model;
    const Json* prompt = Find(parsed, "prompt");
    if (prompt == nullptr) return Bad("prompt", "is required (or messages)");
    if (!prompt->is_string()) return WrongType("prompt", "a string", *prompt);
    out.tokenize.set_text(prompt->get<std::string>());
    ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(parsed, "add_special_tokens"));
    out.tokenize.set_add_bos(add_special.value_or(true));
    out.request.params["text"] = "prompt";
  }
  ASSIGN_OR_RETURN(std::optional<bool> strs, GetBool(parsed, "return_token_strs"));
  out.tokenize.set_return_pieces(strs.value_or(false));
  return out;
}

std::string TokenizeReplyJson(const v1::TokenizeResponse& response, int32_t max_model_len,
                              bool token_strs) {
  OrderedJson out;
  out["count"] = response.token_ids_size();
  out["max_model_len"] = max_model_len;
  out["tokens"] = OrderedJson(std::vector<int32_t>(response.token_ids().begin(),
                                                   response.token_ids().end()));
  out["token_strs"] = token_strs ? OrderedJson(std::vector<std::string>(response.pieces().begin(),
                                                                        response.pieces().end()))
                                 : OrderedJson(nullptr);
  return Dump(out);
}

namespace {

// The head of the pooling endpoints' replies: {"id", "object": "list", "created", "model"}.
OrderedJson ListReply(const std::string& id, const std::string& model, int64_t created) {
  OrderedJson out;
  out["id"] = id;
  out["object"] = "list";
  out["created"] = created;
  out["model"] = model;
  return out;
}

// The pooling endpoints' `input` (/v1/embeddings, /classify): a string, an array of token ids, or
// an array of those; each one input added by `add`.
absl::Status PoolingInputs(const Json& parsed, const std::function<v1::EmbedInput*()>& add,
                           OpenAiRequest* request) {
  const Json* input = Find(parsed, "input");
  if (input == nullptr) return Bad("input", "is required");
  auto add_text = [&](const Json& j) { add()->set_text(j.get<std::string>()); };
  auto add_ids = [&](const Json& j, const std::string& param) {
    return TokenList(j, param, add()->mutable_token_ids()->mutable_ids());
  };
  if (input->is_string()) {
    add_text(*input);
    request->params["inputs[0]"] = "input";  // (one input, not a list)
  } else if (input->is_array() && !input->empty() && (*input)[0].is_number()) {
    RETURN_IF_ERROR(add_ids(*input, "input"));
    request->params["inputs[0]"] = "input";
  } else if (input->is_array()) {
    if (input->empty()) return Bad("input", "is empty");
    for (size_t i = 0; i < input->size(); ++i) {
      const Json& item = (*input)[i];
      const std::string param = absl::StrCat("input[", i, "]");
      if (item.is_string()) {
        add_text(item);
      } else if (item.is_array()) {
        RETURN_IF_ERROR(add_ids(item, param));
      } else {
        return WrongType(param, "a string or an array of token ids", item);
      }
    }
  } else {
    return WrongType("input", "a string, an array of strings or of token-id arrays", *input);
  }
  request->params["inputs"] = "input";
  return absl::OkStatus();
}

// What the pooling endpoints share: `model`, vLLM's `truncate_prompt_tokens` and
// `add_special_tokens` (default true), kvrm's `priority`, `cache_salt` and `request_id`.
template <typename Proto>
absl::Status PoolingFields(const Json& parsed, Proto* proto, OpenAiRequest* request) {
  request->endpoint = OpenAiEndpoint::kCompletions;
  ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(parsed, "model"));
  if (model) request->model = *model;
  ASSIGN_OR_RETURN(std::optional<bool> special, GetBool(parsed, "add_special_tokens"));
  proto->set_skip_special_tokens(!special.value_or(true));
  ASSIGN_OR_RETURN(std::optional<int32_t> truncate, GetInt32(parsed, "truncate_prompt_tokens"));
  if (truncate) proto->set_truncate_prompt_tokens(*truncate);
  ASSIGN_OR_RETURN(std::optional<int32_t> priority, GetInt32(parsed, "priority"));
  if (priority) proto->set_priority(*priority);
  ASSIGN_OR_RETURN(std::optional<std::string> salt, GetString(parsed, "cache_salt"));
  if (salt) proto->set_cache_salt(*salt);
  ASSIGN_OR_RETURN(std::optional<std::string> id, GetString(parsed, "request_id"));
  if (id) proto->set_request_id(*id);
  for (const char* name : {"truncate_prompt_tokens", "priority", "cache_salt", "request_id"}) {
    request->params[name] = name;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiEmbeddings> ParseEmbeddingsRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(Json parsed, ParseBody(body));
  OpenAiEmbeddings out;
  RETURN_IF_ERROR(PoolingInputs(
      parsed, [&] { return out.embed.add_inputs(); }, &out.request));
  RETURN_IF_ERROR(PoolingFields(parsed, &out.embed, &out.request));
  ASSIGN_OR_RETURN(std::optional<std::string> format, GetString(parsed, "encoding_format"));
  if (format && *format != "float" && *format != "base64") {
    return Bad("encoding_format", absl::StrCat("'", *format, "' is not float or base64"));
  }
  out.base64 = format && *format == "base64";
  ASSIGN_OR_RETURN(std::optional<int32_t> dimensions, GetInt32(parsed, "dimensions"));
  if (dimensions) {
    if (*dimensions < 1) return Bad("dimensions", absl::StrCat(*dimensions, " is below 1"));
    out.embed.set_dimensions(*dimensions);
  }
  out.request.params["dimensions"] = "dimensions";
  ASSIGN_OR_RETURN(std::optional<bool> normalize, GetBool(parsed, "normalize"));
  if (normalize) out.embed.set_normalize(*normalize);
  return out;
}

absl::StatusOr<OpenAiClassify> ParseClassifyRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(Json parsed, ParseBody(body));
  OpenAiClassify out;
  RETURN_IF_ERROR(PoolingInputs(
      parsed, [&] { return out.classify.add_inputs(); }, &out.request));
  RETURN_IF_ERROR(PoolingFields(parsed, &out.classify, &out.request));
  return out;
}

std::string ClassifyReplyJson(const v1::ClassifyResponse& response, const std::string& model,
                              int64_t created) {
  OrderedJson out = ListReply(response.request_id(), model, created);
  OrderedJson data = OrderedJson::array();
  for (int i = 0; i < response.classifications_size(); ++i) {
    const v1::Classification& c = response.classifications(i);
    OrderedJson e;
    e["index"] = i;
    e["label"] = c.label_name();
    OrderedJson probs = OrderedJson::array();
    for (float p : c.probs()) probs.push_back(p);
    e["probs"] = std::move(probs);
    e["num_classes"] = c.probs_size();
    data.push_back(std::move(e));
  }
  out["data"] = std::move(data);
  out["usage"] = {{"prompt_tokens", response.prompt_tokens()},
                  {"total_tokens", response.prompt_tokens()}};
  return Dump(out);
}

absl::StatusOr<OpenAiScore> ParseScoreRequest(absl::string_view body, bool rerank) {
  ASSIGN_OR_RETURN(Json parsed, ParseBody(body));
  OpenAiScore out;
  out.rerank = rerank;
  RETURN_IF_ERROR(PoolingFields(parsed, &out.score, &out.request));
  // A string, or (lists_ok) an array of strings, or (rerank documents) of {"text": ...} objects.
  auto texts = [&](const char* param, const char* field, bool lists_ok,
                   std::string* (*add)(v1::ScoreRequest*)) -> absl::Status {
    const Json* v = Find(parsed, param);
    if (v == nullptr) return Bad(param, "is required");
    out.request.params[field] = param;
    if (v->is_string()) {
      *add(&out.score) = v->get<std::string>();
      out.request.params[absl::StrCat(field, "[0]")] = param;
      return absl::OkStatus();
    }
    if (!lists_ok || !v->is_array()) {
      return WrongType(param, lists_ok ? "a string or an array of strings" : "a string", *v);
    }
    if (v->empty()) return Bad(param, "is empty");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& item = (*v)[i];
      const std::string at = absl::StrCat(param, "[", i, "]");
      const Json* text = &item;
      if (rerank && item.is_object()) text = Find(item, "text");  // Cohere's {"text": ...}
      if (text == nullptr || !text->is_string()) {
        return WrongType(at, rerank ? "a string or {\"text\": string}" : "a string", item);
      }
      *add(&out.score) = text->get<std::string>();
    }
    return absl::OkStatus();
  };
  auto add_query = [](v1::ScoreRequest* r) { return r->add_queries(); };
  auto add_document = [](v1::ScoreRequest* r) { return r->add_documents(); };
  if (rerank) {
    RETURN_IF_ERROR(texts("query", "queries", false, add_query));
    RETURN_IF_ERROR(texts("documents", "documents", true, add_document));
    ASSIGN_OR_RETURN(std::optional<int32_t> top_n, GetInt32(parsed, "top_n"));
    if (top_n && *top_n < 0) return Bad("top_n", absl::StrCat(*top_n, " is below 0"));
    out.top_n = top_n.value_or(0);
    ASSIGN_OR_RETURN(std::optional<bool> docs, GetBool(parsed, "return_documents"));
    out.return_documents = docs.value_or(true);
  } else {
    RETURN_IF_ERROR(texts("text_1", "queries", true, add_query));
    RETURN_IF_ERROR(texts("text_2", "documents", true, add_document));
  }
  return out;
}

std::string ScoreReplyJson(const v1::ScoreResponse& response, const OpenAiScore& request,
                           const std::string& model, int64_t created) {
  if (!request.rerank) {
    OrderedJson out = ListReply(response.request_id(), model, created);
    OrderedJson data = OrderedJson::array();
    for (int i = 0; i < response.scores_size(); ++i) {
      OrderedJson e;
      e["index"] = i;
      e["object"] = "score";
      e["score"] = response.scores(i);
      data.push_back(std::move(e));
    }
    out["data"] = std::move(data);
    out["usage"] = {{"prompt_tokens", response.prompt_tokens()},
                    {"total_tokens", response.prompt_tokens()}};
    return Dump(out);
  }
  // Most relevant first (ties in document order), the first top_n (0: all).
  std::vector<int> order(response.scores_size());
  for (int i = 0; i < response.scores_size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return response.scores(a) > response.scores(b); });
  if (request.top_n > 0 && static_cast<size_t>(request.top_n) < order.size()) {
    order.resize(request.top_n);
  }
  OrderedJson out;
  out["id"] = response.request_id();
  out["model"] = model;
  out["usage"] = {{"total_tokens", response.prompt_tokens()}};
  OrderedJson results = OrderedJson::array();
  for (int i : order) {
    OrderedJson r;
    r["index"] = i;
    if (request.return_documents) {
      r["document"] = {{"text", request.score.documents(i)}};
    }
    r["relevance_score"] = response.scores(i);
    results.push_back(std::move(r));
  }
  out["results"] = std::move(results);
  return Dump(out);
}

std::string EmbeddingsReplyJson(const v1::EmbedResponse& response, const std::string& model,
                                int64_t created, bool base64) {
  OrderedJson out = ListReply(response.request_id(), model, created);
  OrderedJson data = OrderedJson::array();
  for (int i = 0; i < response.embeddings_size(); ++i) {
    const auto& values = response.embeddings(i).values();
    OrderedJson e;
    e["object"] = "embedding";
    e["index"] = i;
    if (base64) {
      // float32 little-endian, as numpy.frombuffer(base64.b64decode(s), dtype="float32") reads it.
      std::string bytes(static_cast<size_t>(values.size()) * 4, '\0');
      for (int j = 0; j < values.size(); ++j) {
        uint32_t u;
        std::memcpy(&u, &values[j], 4);
        for (int b = 0; b < 4; ++b) bytes[4 * j + b] = static_cast<char>((u >> (8 * b)) & 0xff);
      }
      e["embedding"] = absl::Base64Escape(bytes);
    } else {
      OrderedJson v = OrderedJson::array();
      for (float x : values) v.push_back(x);
      e["embedding"] = std::move(v);
    }
    data.push_back(std::move(e));
  }
  out["data"] = std::move(data);
  out["usage"] = {{"prompt_tokens", response.prompt_tokens()},
                  {"total_tokens", response.prompt_tokens()}};
  return Dump(out);
}

absl::StatusOr<OpenAiDetokenize> ParseDetokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(Json parsed, ParseBody(body));
  OpenAiDetokenize out;
  ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(parsed, "model"));
  if (model) out.request.model = *model;
  const Json* tokens = Find(parsed, "tokens");
  if (tokens == nullptr) return Bad("tokens", "is required");
  if (!tokens->is_array()) return WrongType("tokens", "an array of token ids", *tokens);
  RETURN_IF_ERROR(TokenList(*tokens, "tokens", out.detokenize.mutable_token_ids()));
  // Special tokens are spelt unless asked otherwise (HF decode's default, as vLLM's /detokenize).
  ASSIGN_OR_RETURN(std::optional<bool> skip, GetBool(parsed, "skip_special_tokens"));
  out.detokenize.set_skip_special_tokens(skip.value_or(false));
  out.request.params["token_ids"] = "tokens";
  return out;
}

std::string DetokenizeReplyJson(const v1::DetokenizeResponse& response) {
  OrderedJson out;
  out["prompt"] = response.text();
  return Dump(out);
}

namespace {

// Anthropic's error type for an HTTP status.
const char* AnthropicErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 405:
    case 409:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return "api_error";
  }
}

}  // namespace

std::string OpenAiError::Json() const {
  if (shape == Shape::kAnthropic) {
    OrderedJson body;
    body["type"] = "error";
    body["error"] = {{"type", AnthropicErrorType(http_status)}, {"message", message}};
    return Dump(body);
  }
  OrderedJson error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = param.empty() ? OrderedJson(nullptr) : OrderedJson(param);
  error["code"] = http_status;
  OrderedJson body;
  body["error"] = std::move(error);
  return Dump(body);
}

OpenAiError ToOpenAiError(const absl::Status& status, const OpenAiRequest* request,
                          int64_t retry_after_ms) {
  OpenAiError e;
  e.retry_after_ms = retry_after_ms;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      // gRPC's own message-size limit (kvrmd --max_message_bytes) is no overload: retrying
      // cannot help.
      if (absl::StrContains(status.message(), "message larger than max")) {
        e.http_status = 413;
        e.type = "invalid_request_error";
      } else {
        e.http_status = 429;
        e.type = "rate_limit_error";
      }
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  std::string message(status.message());
  if (e.http_status == 400) {
    // "field.path[i].x: why": the longest recorded field the path starts with names the param.
    const size_t colon = message.find(": ");
    const std::string path = colon == std::string::npos ? "" : message.substr(0, colon);
    std::string best_field;
    std::string best_param;
    if (request != nullptr && !path.empty()) {
      for (const auto& [field, param] : request->params) {
        if (field.size() <= best_field.size() || !absl::StartsWith(path, field)) continue;
        const char next = path.size() > field.size() ? path[field.size()] : '\0';
        if (next != '\0' && next != '.' && next != '[') continue;
        best_field = field;
        best_param = param;
      }
    }
    if (!best_field.empty()) {
      std::string rest = path.substr(best_field.size());
      // chat.tools[i].parameters is tools[i].function.parameters in OpenAI's shape.
      if (best_param == "tools" && absl::StartsWith(rest, "[")) {
        const size_t close = rest.find(']');
        if (close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == '.') {
          rest.insert(close + 1, ".function");
        }
      }
      // Embed's and Classify's inputs[i].text / .token_ids are input[i] (or input).
      if (absl::StartsWith(best_param, "input")) {
        for (const char* kind : {".text", ".token_ids"}) {
          if (absl::EndsWith(rest, kind)) rest.resize(rest.size() - std::strlen(kind));
        }
      }
      e.param = best_param + rest;
      message = absl::StrCat(e.param, message.substr(colon));
    } else if (!path.empty() && path.find(' ') == std::string::npos) {
      e.param = path;
    }
  }
  e.message = std::move(message);
  return e;
}

std::string OpenAiFinishReason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_TIME_LIMIT:
      return "length";
    case v1::FINISH_REASON_TOOL_CALLS:
      return "tool_calls";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "";
  }
}

std::vector<v1::GenerateRequest> OpenAiCalls(const OpenAiRequest& request) {
  std::vector<v1::GenerateRequest> calls;
  calls.reserve(1 + request.more_prompts.size());
  calls.push_back(request.generate);
  if (request.more_prompts.empty()) return calls;
  const std::string& id = request.generate.request_id();
  if (!id.empty()) calls[0].set_request_id(absl::StrCat(id, "-0"));
  for (size_t p = 0; p < request.more_prompts.size(); ++p) {
    v1::GenerateRequest& call = calls.emplace_back(request.generate);
    call.clear_prompt();
    call.MergeFrom(request.more_prompts[p]);
    if (!id.empty()) call.set_request_id(absl::StrCat(id, "-", p + 1));
  }
  return calls;
}

OpenAiReply::OpenAiReply(const OpenAiRequest& request, const Tokenizer* tokenizer, std::string id,
                         int64_t created, std::string model, std::vector<std::string> prompt_texts)
    : request_(request),
      tokenizer_(tokenizer),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      prompt_texts_(std::move(prompt_texts)),
      prompts_(1 + static_cast<int>(request.more_prompts.size())),
      n_(std::max(1, request.generate.n())) {
  choices_.resize(static_cast<size_t>(prompts_) * n_);
  prompt_logprobs_.resize(prompts_);
  prompt_ids_.resize(prompts_);
  prompt_tokens_.resize(prompts_);
}

const std::vector<v1::TokenLogprob>& OpenAiReply::ScoredPrompt(int prompt) const {
  return prompt_logprobs_[std::clamp(prompt, 0, prompts_ - 1)];
}

void OpenAiReply::NotePrompt(int prompt, const v1::GenerateResponse& m) {
  prompt = std::clamp(prompt, 0, prompts_ - 1);
  choices_[ChoiceIndex(prompt, m.index())].tokens += m.token_ids_size();
  if (m.has_prompt_usage()) {
    prompt_tokens_[prompt] = m.prompt_usage().prompt_tokens();
  } else if (m.has_finished() && prompt_tokens_[prompt] == 0) {
    // A completion whose only message is its end (a beam search's; one that ended before its
    // first token).
    prompt_tokens_[prompt] = m.finished().usage().prompt_tokens();
  }
  if (m.prompt_token_ids_size() > 0 && prompt_ids_[prompt].empty()) {
    prompt_ids_[prompt].assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
  }
  if (m.prompt_logprobs_size() == 0) return;
  prompt_logprobs_[prompt].assign(m.prompt_logprobs().begin(), m.prompt_logprobs().end());
}

const std::vector<int32_t>& OpenAiReply::PromptIds(int prompt) const {
  return prompt_ids_[std::clamp(prompt, 0, prompts_ - 1)];
}

OrderedJson OpenAiReply::PromptIdsJson(int prompt) const {
  const std::vector<int32_t>& ids = PromptIds(prompt);
  return ids.empty() ? OrderedJson(nullptr) : OrderedJson(ids);
}

bool OpenAiReply::echo_scores_prompt() const {
  return request_.endpoint == OpenAiEndpoint::kCompletions && request_.echo &&
         request_.logprobs >= 0;
}

OrderedJson OpenAiReply::PromptLogprobsJson(int prompt) const {
  const std::vector<v1::TokenLogprob>& entries = ScoredPrompt(prompt);
  if (entries.empty()) return nullptr;
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const v1::TokenLogprob& e = entries[i];
    if (i == 0) {  // nothing precedes the first token
      out.push_back(nullptr);
      continue;
    }
    OrderedJson m = OrderedJson::object();
    m[std::to_string(e.token_id())] = {
        {"logprob", e.logprob()},
        {"rank", e.rank()},
        // (return_tokens_as_token_ids spells logprobs only)
        {"decoded_token", openai_json::TokenText(tokenizer_, e.token_id(), false)}};
    for (int j = 0; j < std::min(e.top_size(), request_.prompt_logprobs); ++j) {
      const v1::TopLogprob& a = e.top(j);
      const std::string key = std::to_string(a.token_id());
      if (m.contains(key)) continue;  // the prompt token is among its own alternatives
      m[key] = {{"logprob", a.logprob()}, {"rank", j + 1}, {"decoded_token", a.text()}};
    }
    out.push_back(std::move(m));
  }
  return out;
}

int OpenAiReply::ChoiceIndex(int prompt, int index) const {
  prompt = std::clamp(prompt, 0, prompts_ - 1);
  index = std::clamp(index, 0, n_ - 1);
  return prompt * n_ + index;
}

const std::string& OpenAiReply::PromptText(int prompt) const {
  static const std::string* const kNone = new std::string();
  if (prompt < 0 || prompt >= static_cast<int>(prompt_texts_.size())) return *kNone;
  return prompt_texts_[prompt];
}

std::string openai_json::TokenText(const Tokenizer* tokenizer, int32_t id, bool bytes) {
  if (tokenizer == nullptr) return "";
  return bytes ? tokenizer->DecodeBytes({id}, /*skip_special_tokens=*/false)
               : tokenizer->Decode({id}, /*skip_special_tokens=*/false);
}

std::string OpenAiReply::TokenText(int32_t id, bool bytes) const {
  if (request_.tokens_as_ids) return absl::StrCat("token_id:", id);
  return openai_json::TokenText(tokenizer_, id, bytes);
}

namespace {

// Appends `entries` to a completions logprobs object (`tokens`, `token_logprobs`,
// `top_logprobs`, `text_offset`; made on first use). `offset` is the text offset of the first
// token; each entry gives at most `max_top` alternatives; with `unscored_first` the first entry's
// logprob and alternatives are null (a prompt's first token: nothing precedes it).
void AppendCompletionLogprobs(const std::vector<v1::TokenLogprob>& entries,
                              const std::function<std::string(int32_t, bool)>& text,
                              size_t offset, int max_top, bool unscored_first, OrderedJson* out) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    if (!out->contains(key)) (*out)[key] = OrderedJson::array();
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const v1::TokenLogprob& e = entries[i];
    const std::string t = text(e.token_id(), false);
    (*out)["tokens"].push_back(t);
    (*out)["text_offset"].push_back(offset);
    offset += t.size();
    if (i == 0 && unscored_first) {  // OpenAI's and vLLM's null for the first token
      (*out)["token_logprobs"].push_back(nullptr);
      (*out)["top_logprobs"].push_back(nullptr);
      continue;
    }
    (*out)["token_logprobs"].push_back(e.logprob());
    OrderedJson alternatives = OrderedJson::object();
    for (int j = 0; j < std::min(e.top_size(), max_top); ++j) {
      alternatives[text(e.top(j).token_id(), false)] = e.top(j).logprob();
    }
    (*out)["top_logprobs"].push_back(std::move(alternatives));
  }
}

// Completions' logprobs object for `entries`; `offset` is the text offset of the first token.
OrderedJson CompletionLogprobs(const std::vector<v1::TokenLogprob>& entries,
                               const std::function<std::string(int32_t, bool)>& text,
                               size_t offset) {
  OrderedJson out;
  AppendCompletionLogprobs(entries, text, offset, std::numeric_limits<int>::max(),
                           /*unscored_first=*/false, &out);
  return out;
}

}  // namespace

OrderedJson OpenAiReply::EchoedLogprobs(int prompt,
                                        const std::vector<v1::TokenLogprob>& entries) const {
  const auto text = [this](int32_t id, bool bytes) { return TokenText(id, bytes); };
  // The prompt's tokens from offset 0 (their alternatives cut to `logprobs`: the prompt may have
  // been scored with more for `prompt_logprobs`), then the completion's at their offsets in the
  // echoed text.
  OrderedJson out;
  AppendCompletionLogprobs(ScoredPrompt(prompt), text, 0, request_.logprobs,
                           /*unscored_first=*/true, &out);
  AppendCompletionLogprobs(entries, text, PromptText(prompt).size(),
                           std::numeric_limits<int>::max(), /*unscored_first=*/false, &out);
  return out;
}

namespace {

OrderedJson ByteList(const std::string& s) {
  OrderedJson b = OrderedJson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}, ...]}.
OrderedJson ChatLogprobs(const std::vector<v1::TokenLogprob>& entries,
                         const std::function<std::string(int32_t, bool)>& text) {
  OrderedJson out;
  out["content"] = openai_json::LogprobEntries(entries, text);
  return out;
}

}  // namespace

OrderedJson openai_json::LogprobEntries(absl::Span<const v1::TokenLogprob> entries,
                                        const std::function<std::string(int32_t, bool)>& text) {
  OrderedJson content = OrderedJson::array();
  for (const v1::TokenLogprob& e : entries) {
    OrderedJson top = OrderedJson::array();
    for (const v1::TopLogprob& a : e.top()) {
      top.push_back({{"token", text(a.token_id(), false)},
                     {"logprob", a.logprob()},
                     {"bytes", ByteList(text(a.token_id(), true))}});
    }
    content.push_back({{"token", text(e.token_id(), false)},
                       {"logprob", e.logprob()},
                       {"bytes", ByteList(text(e.token_id(), true))},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

OrderedJson OpenAiReply::UsageSoFar(int prompt, int index) const {
  // As vLLM counts a chunk's (continuous_usage_stats): its prompt's tokens and its choice's
  // tokens up to it.
  const int64_t prompt_tokens = prompt_tokens_[std::clamp(prompt, 0, prompts_ - 1)];
  const int64_t completion = choices_[index].tokens;
  OrderedJson usage;
  usage["prompt_tokens"] = prompt_tokens;
  usage["completion_tokens"] = completion;
  usage["total_tokens"] = prompt_tokens + completion;
  return usage;
}

OrderedJson OpenAiReply::Usage() const {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached = 0;
  int64_t reasoning = 0;
  for (int p = 0; p < prompts_; ++p) {
    int64_t prompt_p = 0;  // one prompt for its n completions
    int64_t cached_p = 0;
    for (int j = 0; j < n_; ++j) {
      const v1::Usage& u = choices_[p * n_ + j].finished.usage();
      prompt_p = std::max<int64_t>(prompt_p, u.prompt_tokens());
      cached_p = std::max<int64_t>(cached_p, u.cached_prompt_tokens());
      completion += u.completion_tokens();
      reasoning += u.reasoning_tokens();
    }
    prompt += prompt_p;
    cached += cached_p;
  }
  OrderedJson usage;
  usage["prompt_tokens"] = prompt;
  usage["completion_tokens"] = completion;
  usage["total_tokens"] = prompt + completion;
  usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
  // OpenAI's, for a thinking model's chat replies.
  if (reasoning > 0) usage["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return usage;
}

OrderedJson OpenAiReply::Head(bool chunk) const {
  const bool chat = request_.endpoint == OpenAiEndpoint::kChatCompletions;
  OrderedJson head;
  head["id"] = id_;
  head["object"] = !chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
  head["created"] = created_;
  head["model"] = model_;
  return head;
}

void OpenAiReply::NoteFinish(Choice& c, const v1::GenerateResponse& m) {
  if (!m.has_finished()) return;
  c.finished = m.finished();
  c.done = true;
  if (m.finished().reason() == v1::FINISH_REASON_ERROR && engine_error_.empty()) {
    engine_error_ = m.finished().error();
  }
}

std::string OpenAiReply::StreamStart() {
  if (request_.endpoint != OpenAiEndpoint::kChatCompletions) return "";
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    OrderedJson chunk = Head(/*chunk=*/true);
    OrderedJson choice;
    choice["index"] = i;
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    chunk["choices"] = OrderedJson::array({choice});
    out += Sse(Dump(chunk));
  }
  return out;
}

std::string OpenAiReply::Chunk(int prompt, int index, const v1::GenerateResponse& m) {
  Choice& c = choices_[index];
  const bool chat = request_.endpoint == OpenAiEndpoint::kChatCompletions;
  const auto text = [this](int32_t id, bool bytes) { return TokenText(id, bytes); };
  std::string delta_text = m.text();
  if (!chat && request_.echo && !c.echoed) {
    delta_text = PromptText(prompt) + delta_text;
    c.echoed = true;
  }
  const bool finished = m.has_finished();
  const bool calls = finished && m.finished().tool_calls_size() > 0;
  const bool call_deltas = chat && m.tool_call_deltas_size() > 0;
  const bool reasoning = chat && !m.reasoning_text().empty();
  // The prompt's scores go out with each choice's first chunk after they arrived.
  const bool score_prompt = !c.prompt_scored &&
                            !ScoredPrompt(prompt).empty() &&
                            (request_.prompt_logprobs >= 0 || echo_scores_prompt());
  // return_token_ids: the prompt's ids with the choice's first chunk after they arrived, and
  // every chunk's generated ids (a message whose text is held back still sends its ids).
  const bool send_prompt_ids =
      request_.return_token_ids && !c.prompt_ids_sent && !PromptIds(prompt).empty();
  const bool send_ids = request_.return_token_ids && m.token_ids_size() > 0;
  if (delta_text.empty() && m.logprobs_size() == 0 && !finished && !call_deltas && !reasoning &&
      !score_prompt && !send_prompt_ids && !send_ids) {
    return "";
  }
  OrderedJson chunk = Head(/*chunk=*/true);
  OrderedJson choice;
  choice["index"] = index;
  const std::vector<v1::TokenLogprob> entries(m.logprobs().begin(), m.logprobs().end());
  if (chat) {
    OrderedJson delta = OrderedJson::object();
    // The thinking of a model that thinks before it answers (vLLM's and DeepSeek's field).
    if (reasoning) delta["reasoning_content"] = m.reasoning_text();
    if (!delta_text.empty()) delta["content"] = delta_text;
    // Calls as they are generated (OpenAI's shape: the first piece of a call has its id, type
    // and name, each piece the next part of function.arguments); at the end, the calls that
    // were not streamed, whole.
    OrderedJson tool_calls = OrderedJson::array();
    for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
      OrderedJson call;
      call["index"] = d.index();
      OrderedJson function = OrderedJson::object();
      if (!d.id().empty()) {
        c.streamed_ids.insert(d.id());
        c.streamed_indices.insert(d.index());
        call["id"] = d.id();
        call["type"] = "function";
        function["name"] = d.name();
      }
      function["arguments"] = d.arguments();
      call["function"] = std::move(function);
      tool_calls.push_back(std::move(call));
    }
    if (calls) {
      for (OrderedJson& call :
           OpenAiToolCalls(m.finished(), /*with_index=*/true, c.streamed_ids, c.streamed_indices)) {
        tool_calls.push_back(std::move(call));
      }
    }
    if (!tool_calls.empty()) delta["tool_calls"] = std::move(tool_calls);
    choice["delta"] = std::move(delta);
    choice["logprobs"] =
        request_.logprobs >= 0 && !entries.empty() ? ChatLogprobs(entries, text) : nullptr;
  } else {
    choice["text"] = delta_text;
    if (score_prompt && echo_scores_prompt()) {
      choice["logprobs"] = EchoedLogprobs(prompt, entries);
    } else {
      choice["logprobs"] = request_.logprobs >= 0 && !entries.empty()
                               ? CompletionLogprobs(entries, text, c.text.size())
                               : nullptr;
    }
    if (score_prompt && request_.prompt_logprobs >= 0) {
      choice["prompt_logprobs"] = PromptLogprobsJson(prompt);
    }
  }
  if (score_prompt && chat && request_.prompt_logprobs >= 0) {
    chunk["prompt_logprobs"] = PromptLogprobsJson(prompt);
  }
  c.prompt_scored = c.prompt_scored || score_prompt;
  if (send_prompt_ids) {
    // vLLM's places: the chat chunk's, a completion choice's.
    (chat ? chunk : choice)["prompt_token_ids"] = PromptIdsJson(prompt);
    c.prompt_ids_sent = true;
  }
  if (request_.return_token_ids) {
    choice["token_ids"] = std::vector<int32_t>(m.token_ids().begin(), m.token_ids().end());
  }
  c.text += delta_text;
  if (finished) {
    choice["finish_reason"] = OpenAiFinishReason(m.finished().reason());
    choice["stop_reason"] = StopReason(m.finished());
  } else {
    choice["finish_reason"] = nullptr;
  }
  chunk["choices"] = OrderedJson::array({std::move(choice)});
  if (request_.include_usage && request_.continuous_usage) {
    chunk["usage"] = UsageSoFar(prompt, index);
  }
  return Sse(Dump(chunk));
}

std::string OpenAiReply::StreamMessage(const v1::GenerateResponse& m, int prompt) {
  NotePrompt(prompt, m);
  const int index = ChoiceIndex(prompt, m.index());
  NoteFinish(choices_[index], m);
  return Chunk(prompt, index, m);
}

std::string OpenAiReply::StreamEnd() {
  std::string out;
  if (request_.include_usage) {
    OrderedJson chunk = Head(/*chunk=*/true);
    chunk["choices"] = OrderedJson::array();
    chunk["usage"] = Usage();
    out += Sse(Dump(chunk));
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string OpenAiReply::StreamError(const OpenAiError& error) {
  return Sse(error.Json());
}

void OpenAiReply::Add(const v1::GenerateResponse& m, int prompt) {
  NotePrompt(prompt, m);
  Choice& c = choices_[ChoiceIndex(prompt, m.index())];
  if (request_.return_token_ids)
    c.token_ids.insert(c.token_ids.end(), m.token_ids().begin(), m.token_ids().end());
  c.text += m.text();
  c.reasoning += m.reasoning_text();
  c.logprobs.insert(c.logprobs.end(), m.logprobs().begin(), m.logprobs().end());
  NoteFinish(c, m);
}

std::string OpenAiReply::Body() const {
  const bool chat = request_.endpoint == OpenAiEndpoint::kChatCompletions;
  const auto text = [this](int32_t id, bool bytes) { return TokenText(id, bytes); };
  OrderedJson body = Head(/*chunk=*/false);
  OrderedJson choices = OrderedJson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    OrderedJson choice;
    choice["index"] = i;
    if (chat) {
      OrderedJson message;
      message["role"] = "assistant";
      const bool calls = c.finished.tool_calls_size() > 0;
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      message["content"] = c.text.empty() && calls ? OrderedJson(nullptr) : OrderedJson(c.text);
      if (calls) message["tool_calls"] = OpenAiToolCalls(c.finished, /*with_index=*/false);
      choice["message"] = std::move(message);
      choice["logprobs"] = request_.logprobs >= 0 ? ChatLogprobs(c.logprobs, text) : nullptr;
    } else {
      const int prompt = static_cast<int>(i) / n_;
      const std::string echo = request_.echo ? PromptText(prompt) : "";
      choice["text"] = echo + c.text;
      choice["logprobs"] = echo_scores_prompt() ? EchoedLogprobs(prompt, c.logprobs)
                           : request_.logprobs >= 0
                               ? CompletionLogprobs(c.logprobs, text, echo.size())
                               : nullptr;
      if (request_.prompt_logprobs >= 0) choice["prompt_logprobs"] = PromptLogprobsJson(prompt);
      if (request_.return_token_ids) choice["prompt_token_ids"] = PromptIdsJson(prompt);
    }
    if (request_.return_token_ids) choice["token_ids"] = c.token_ids;
    const std::string finish = OpenAiFinishReason(c.finished.reason());
    choice["finish_reason"] = finish.empty() ? OrderedJson(nullptr) : OrderedJson(finish);
    choice["stop_reason"] = StopReason(c.finished);
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  // Chat: vLLM puts the prompt's scores on the response.
  if (chat && request_.prompt_logprobs >= 0) body["prompt_logprobs"] = PromptLogprobsJson(0);
  if (chat && request_.return_token_ids) body["prompt_token_ids"] = PromptIdsJson(0);
  body["usage"] = Usage();
  return Dump(body);
}

}  // namespace kvrm
