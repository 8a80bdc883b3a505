// Serialises a trained byte-level BPE as Hugging Face tokenizer.json / tokenizer_config.json in
// the Llama 3 layout (Split regex + ByteLevel pre-tokenizer, TemplateProcessing adding
// <|begin_of_text|>, ByteLevel decoder).
#ifndef KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_
#define KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_

#include <array>
#include <string>
#include <string_view>

#include "tools/modelgen/bpe_trainer.h"

namespace kvrm::modelgen {

// Appended after the BPE tokens, in this order, taking the last ids of the vocabulary.
inline constexpr std::array<std::string_view, 4> kSpecialTokens = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"};
inline constexpr int kBosIndex = 0;  // into kSpecialTokens
inline constexpr int kEosIndex = 1;
inline constexpr int kEotIndex = 2;
inline constexpr int kPadIndex = 3;

// The chat template written into tokenizer_config.json: Llama 3's layout with plain-text role
// headers (the vocabulary has no header tokens), each turn ended by <|eot_id|> (an EOS id in
// config.json, so a reply stops at its turn's end); an unknown role is the template's error.
// [system "Be brief.", user "Hi"] renders
// "<|begin_of_text|>system:\nBe brief.<|eot_id|>user:\nHi<|eot_id|>assistant:\n".
// With tools it writes them into a system turn and teaches the Hermes call format
// (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, what kvrmd then parses); assistant
// turns with tool_calls and "tool" turns render in that format too. Without tools the text is
// what kChatTemplateV1 (the template before tools) renders.
inline constexpr std::string_view kChatTemplate =
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- 'system:\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] | trim + '\n\n' }}"
    "{%- endif %}"
    "{{- 'Functions you may call:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\nCall one as <tool_call>{\"name\": <name>, \"arguments\": <object>}"
    "</tool_call>.<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role: ' + message['role'] + "
    "' (this template takes system, user, assistant and tool)') }}"
    "{%- endif %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- 'assistant:\n' }}"
    "{%- if message['content'] %}{{- message['content'] | trim + '\n' }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + "
    "call['function']['arguments'] | tojson + '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- 'tool:\n<tool_response>' + message['content'] | trim + '</tool_response><|eot_id|>' }}"
    "{%- else %}"
    "{{- message['role'] + ':\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant:\n' }}{%- endif %}";

// The built-in template of kvrm 0.1 before tools; a cached model directory holding it is
// upgraded to kChatTemplate.
inline constexpr std::string_view kChatTemplateV1 =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('unknown role: ' + message['role'] + "
    "' (this template takes system, user and assistant)') }}"
    "{%- endif %}"
    "{{- message['role'] + ':\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant:\n' }}{%- endif %}";

// Id of special token `index` given the BPE model (they follow its tokens).
inline int SpecialTokenId(const BpeModel& bpe, int index) {
  return static_cast<int>(bpe.tokens.size()) + index;
}

// Pretty-printed, deterministic (keys in a fixed order, vocab in id order), UTF-8 JSON.
std::string BuildTokenizerJson(const BpeModel& bpe);
std::string BuildTokenizerConfigJson(const BpeModel& bpe, int model_max_length);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_
