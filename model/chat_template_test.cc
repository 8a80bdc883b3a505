#include "model/chat_template.h"

#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

// ---- real templates (as they appear in tokenizer_config.json, JSON string escapes undone) ----

// meta-llama/Meta-Llama-3-8B-Instruct.
constexpr char kLlama3[] =
    R"TPL({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})TPL";

// Llama 3.1 / 3.2 style (the tool-less paths are what we exercise; tools is none).
constexpr char kLlama32[] = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

// ChatML as in Qwen2-Instruct (default system prompt when none is given).
constexpr char kQwen2[] =
    R"TPL({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})TPL";

// Qwen2.5-Instruct style: multi-line, whitespace-controlled, tool branches.
constexpr char kQwen25[] = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

// mistralai/Mistral-7B-Instruct-v0.1 style.
constexpr char kMistral[] =
    R"TPL({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})TPL";

// meta-llama/Llama-2-7b-chat-hf.
constexpr char kLlama2[] =
    R"TPL({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})TPL";

// google/gemma-2b-it.
constexpr char kGemma[] =
    R"TPL({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})TPL";

// HuggingFaceH4/zephyr-7b-beta: relies on trim_blocks.
constexpr char kZephyr[] = R"TPL({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})TPL";

// microsoft/Phi-3-mini-4k-instruct style.
constexpr char kPhi3[] =
    R"TPL({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %})TPL";

// DeepSeek-R1 style: namespace, split, `in`, whitespace control.
constexpr char kDeepSeek[] =
    R"TPL({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- set ns.is_tool = false -%}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %})TPL";

const char* const kAllTemplates[] = {kLlama3, kLlama32, kQwen2,  kQwen25, kMistral,
                                     kLlama2, kGemma,   kZephyr, kPhi3,   kDeepSeek};

// ---- helpers ------------------------------------------------------------------------------------

ChatTemplateInputs Inputs(std::vector<ChatMessage> messages, bool add_generation_prompt = true,
                          std::string bos = "<s>", std::string eos = "</s>") {
  ChatTemplateInputs in;
  in.messages = std::move(messages);
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = std::move(bos);
  in.eos_token = std::move(eos);
  in.now = absl::FromCivil(absl::CivilSecond(2024, 9, 5, 12, 0, 0), absl::UTCTimeZone());
  in.time_zone = absl::UTCTimeZone();
  return in;
}

absl::StatusOr<std::string> Render(std::string_view source, const ChatTemplateInputs& in) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(in);
}

// Renders with no messages; the expected output or a failure naming the status.
std::string R(std::string_view source) {
  absl::StatusOr<std::string> out = Render(source, Inputs({}));
  if (!out.ok()) return "ERROR: " + out.status().ToString();
  return *out;
}

std::string ErrorOf(std::string_view source, const ChatTemplateInputs& in = Inputs({})) {
  absl::StatusOr<std::string> out = Render(source, in);
  if (out.ok()) return "OK: " + *out;
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  return std::string(out.status().message());
}

// ---- real templates -----------------------------------------------------------------------------

TEST(ChatTemplateTest, Llama3) {
  const ChatTemplateInputs in = Inputs(
      {{"system", "You are a bot."}, {"user", "  Hi!  "}, {"assistant", "Hello."}, {"user", "Bye"}},
      true, "<|begin_of_text|>");
  EXPECT_EQ(
      *Render(kLlama3, in),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  ChatTemplateInputs no_prompt = Inputs({{"user", "Hi"}}, false, "<|begin_of_text|>");
  EXPECT_EQ(*Render(kLlama3, no_prompt),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplateTest, Llama32WithDateAndToolMessage) {
  const ChatTemplateInputs in = Inputs(
      {{"system", "  You are helpful.  "}, {"user", "Hi"}, {"assistant", "Hello"}, {"tool", "42"}},
      true, "<|begin_of_text|>");
  // A string tool result "is iterable", so the template emits it through tojson (quoted).
  EXPECT_EQ(*Render(kLlama32, in),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 05 Sep 2024\n\n"
            "You are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"42\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(*Render(kLlama32, Inputs({{"user", "Yo"}}, false, "<|begin_of_text|>")),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 05 Sep 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nYo<|eot_id|>");
}

TEST(ChatTemplateTest, Qwen2ChatMl) {
  EXPECT_EQ(*Render(kQwen2, Inputs({{"user", "Hi"}})),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*Render(kQwen2, Inputs({{"system", "Be terse."}, {"user", "Hi"}}, false)),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen25MultiLine) {
  const ChatTemplateInputs in = Inputs({{"system", "S"},
                                        {"user", "U"},
                                        {"assistant", "A"},
                                        {"tool", "T1"},
                                        {"tool", "T2"},
                                        {"user", "U2"}});
  EXPECT_EQ(*Render(kQwen25, in),
            "<|im_start|>system\nS<|im_end|>\n"
            "<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nT1\n</tool_response>"
            "\n<tool_response>\nT2\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*Render(kQwen25, Inputs({{"user", "Hi"}}, false)),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen25WithToolsAndToolCalls) {
  ChatTemplateInputs in = Inputs({{"system", "S"}, {"user", "Weather?"}});
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Lima", "days": [1, 2]})"});
  in.messages.push_back(call);
  ChatMessage result{"tool", "18C"};
  result.tool_call_id = "call_1";
  in.messages.push_back(result);
  in.tools = {R"({"type": "function", "function": {"name": "get_weather", "parameters": )"
              R"({"type": "object", "properties": {"city": {"type": "string"}}}}})"};
  // As transformers renders it: tojson with Python's separators, the keys in their order, the
  // arguments a dict (not a string), no content line for a call without content.
  EXPECT_EQ(*Render(kQwen25, in),
            "<|im_start|>system\nS\n\n# Tools\n\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
            "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n"
            "</tools><|im_end|>\n"
            "<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Lima\", \"days\": [1, 2]}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, MessageFieldsToolsAndExtraVariables) {
  constexpr char kShow[] =
      "{%- for m in messages %}{{ m | tojson }}\n{% endfor %}"
      "{{ tools is none }} {{ enable_thinking }} {{ opts.depth }} {{ opts.tags | join(',') }}";
  ChatTemplateInputs in = Inputs({{"user", "hi"}});
  ChatMessage call{"assistant", "Checking."};
  call.tool_calls.push_back({"", "now", ""});
  in.messages.push_back(call);
  ChatMessage result{"tool", "12:00"};
  result.tool_call_id = "c9";
  result.name = "now";
  in.messages.push_back(result);
  in.extra_variables = R"({"enable_thinking": false, "opts": {"depth": 2, "tags": ["a", "b"]}})";
  EXPECT_EQ(*Render(kShow, in),
            "{\"role\": \"user\", \"content\": \"hi\"}\n"
            "{\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": [{\"type\": "
            "\"function\", \"function\": {\"name\": \"now\", \"arguments\": {}}}]}\n"
            "{\"role\": \"tool\", \"content\": \"12:00\", \"tool_call_id\": \"c9\", \"name\": "
            "\"now\"}\n"
            "True False 2 a,b");
  // Bad inputs fail cleanly, naming what was wrong.
  in.extra_variables = R"({"messages": []})";
  EXPECT_THAT(ErrorOf(kShow, in), HasSubstr("would replace a standard one"));
  in.extra_variables = "[1]";
  EXPECT_THAT(ErrorOf(kShow, in), HasSubstr("must be a JSON object"));
  in.extra_variables = "";
  in.tools = {"{\"type\": "};
  EXPECT_THAT(ErrorOf(kShow, in), HasSubstr("tools[0]: invalid JSON"));
  in.tools.clear();
  in.messages[1].tool_calls[0].arguments = "{";
  EXPECT_THAT(ErrorOf(kShow, in), HasSubstr("messages[1].tool_calls[0].arguments"));
}

TEST(ChatTemplateTest, MistralAndAlternation) {
  EXPECT_EQ(
      *Render(kMistral, Inputs({{"user", "Hi"}, {"assistant", "Hello"}, {"user", "How are you?"}})),
      "<s>[INST] Hi [/INST]Hello</s>[INST] How are you? [/INST]");
  absl::StatusOr<std::string> bad = Render(kMistral, Inputs({{"user", "a"}, {"user", "b"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_EQ(ErrorOf(kMistral, Inputs({{"system", "s"}, {"user", "u"}})),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_EQ(ErrorOf(kMistral, Inputs({{"user", "u"}, {"tool", "t"}})),
            "Only user and assistant roles are supported!");
}

TEST(ChatTemplateTest, Llama2SystemPromptFolded) {
  EXPECT_EQ(*Render(kLlama2, Inputs({{"system", "Be nice."},
                                     {"user", "Hi"},
                                     {"assistant", "Hello!"},
                                     {"user", "Bye"}})),
            "<s>[INST] <<SYS>>\nBe nice.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(*Render(kLlama2, Inputs({{"user", " Hi "}})), "<s>[INST] Hi [/INST]");
}

TEST(ChatTemplateTest, Gemma) {
  EXPECT_EQ(*Render(kGemma, Inputs({{"user", " Hi "}, {"assistant", "Hello"}}, true, "<bos>")),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(ErrorOf(kGemma, Inputs({{"system", "s"}, {"user", "u"}})), "System role not supported");
}

TEST(ChatTemplateTest, ZephyrTrimBlocks) {
  EXPECT_EQ(*Render(kZephyr, Inputs({{"system", "S"}, {"user", "U"}})),
            "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n");
  EXPECT_EQ(*Render(kZephyr, Inputs({{"system", "S"}, {"user", "U"}}, false)),
            "<|system|>\nS</s>\n<|user|>\nU</s>\n");
}

TEST(ChatTemplateTest, Phi3) {
  EXPECT_EQ(
      *Render(kPhi3, Inputs({{"user", "Hi"}, {"assistant", "Hello"}}, false, "", "<|endoftext|>")),
      "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|endoftext|>");
  EXPECT_EQ(*Render(kPhi3, Inputs({{"user", "Hi"}})), "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplateTest, DeepSeekNamespaceAndSplit) {
  EXPECT_EQ(*Render(kDeepSeek, Inputs({{"system", "SYS"},
                                       {"user", "Q1"},
                                       {"assistant", "<think>hmm</think>A1"},
                                       {"user", "Q2"}},
                                      true, "<｜begin▁of▁sentence｜>")),
            "<｜begin▁of▁sentence｜>SYS<｜User｜>Q1<｜Assistant｜>A1<｜end▁of▁sentence｜>"
            "<｜User｜>Q2<｜Assistant｜><think>\n");
}

TEST(ChatTemplateTest, Qwen3LastQueryIndex) {
  // The Qwen3 template's scan for the last real user query (reversed slice, namespace, not(...)).
  constexpr char kScan[] = R"TPL(
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{{- ns.last_query_index }}
{%- set content = messages[1].content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{{- '|' + content + '|' }})TPL";
  EXPECT_EQ(*Render(kScan, Inputs({{"user", "u1"},
                                   {"assistant", "<think>\nplan\n</think>\nanswer"},
                                   {"user", "<tool_response>x</tool_response>"}})),
            "0|plan|");
}

TEST(ChatTemplateTest, CopyableAndThreadSafe) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(kQwen25);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ChatTemplate copy = *parsed;
  const ChatTemplateInputs in = Inputs({{"system", "S"}, {"user", "U"}});
  const std::string expected = *copy.Render(in);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) ok[t] += *parsed->Render(in) == expected;
    });
  }
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 200);
}

// ---- whitespace ---------------------------------------------------------------------------------

TEST(ChatTemplateTest, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(R("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(R("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(R("a  {% if true %}x{% endif %}"), "a  x");  // not at the start of a line
  EXPECT_EQ(R("line\n    {% if true %}\n    x\n    {% endif %}\nend"), "line\n    x\nend");
  EXPECT_EQ(R("  {{ 'x' }}\ny"), "  x\ny");             // {{ }} is neither trimmed nor stripped
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");  // + disables lstrip
  EXPECT_EQ(R("{% if true +%}\nx{% endif %}"), "\nx");  // + disables trim
  EXPECT_EQ(R("a {# comment #} b"), "a  b");
  EXPECT_EQ(R("a\n  {# comment #}\nb"), "a\nb");
  EXPECT_EQ(R("hello\n"), "hello");  // keep_trailing_newline=False
  EXPECT_EQ(R("hello\n\n"), "hello\n");
  EXPECT_EQ(R("a\r\n{% if true %}\r\nb{% endif %}"), "a\nb");
}

TEST(ChatTemplateTest, WhitespaceControl) {
  EXPECT_EQ(R("a   {{- 'b' -}}   c"), "abc");
  EXPECT_EQ(R("{%- if true -%}  x  {%- endif %}"), "x");
  EXPECT_EQ(R("a \n {#- c -#} \n b"), "ab");
  EXPECT_EQ(R("{% for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}"), "12");
  EXPECT_EQ(R("{% raw %}{{ x }}{% if %}{% endraw %}!"), "{{ x }}{% if %}!");
}

// ---- statements ---------------------------------------------------------------------------------

TEST(ChatTemplateTest, Loops) {
  EXPECT_EQ(R("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
              "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ x }};{% endfor %}"),
            "10TrueFalse33a;21FalseFalse32b;32FalseTrue31c;");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}"),
            "1,3,5,7,9");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=[1, 2];");
  EXPECT_EQ(R("{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}"), "xy");
  EXPECT_EQ(R("{% for c in 'hé' %}[{{ c }}]{% endfor %}"), "[h][é]");
  EXPECT_EQ(R("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} "
              "{% endfor %}{{ loop.index }}|{% endfor %}"),
            "131 142 1|231 242 2|");
  EXPECT_EQ(R("{% for x in nothing %}x{% endfor %}"), "");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"),
            "-2,1-3,2-,");
}

TEST(ChatTemplateTest, SetScopingAndNamespace) {
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "21");
  EXPECT_EQ(R("{% set ns = namespace(n=0, found=false) %}{% for i in [1, 2, 3] %}"
              "{% set ns.n = ns.n + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}"
              "{% endfor %}{{ ns.n }} {{ ns.found }}"),
            "6 True");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]"), "[a1b]");
  EXPECT_EQ(R("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");  // if has no scope
  EXPECT_THAT(ErrorOf("{% set d = {} %}{% set d.x = 1 %}"),
              HasSubstr("cannot assign attribute on non-namespace object 'd'"));
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}{{ [ns] }}"),
            "<Namespace>[<Namespace>]");
}

TEST(ChatTemplateTest, MacrosAndGeneration) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Bob') }} {{ greet('Al', punct='?') }}"),
            "Hello Bob! Hello Al?");
  EXPECT_EQ(R("{% set g = 'G' %}{% macro m() %}{{ g }}{{ local is defined }}{% endmacro %}"
              "{% for local in [1] %}{{ m() }}{% endfor %}"),
            "GFalse");
  EXPECT_THAT(ErrorOf("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              HasSubstr("macro calls nested too deep"));
  EXPECT_EQ(R("{% generation %}abc{% endgeneration %}"), "abc");
  EXPECT_THAT(ErrorOf("{% call foo() %}x{% endcall %}"), HasSubstr("unsupported tag 'call'"));
  EXPECT_THAT(ErrorOf("{% call f() %}x{% endcall %}"), HasSubstr("unsupported tag 'call'"));
  EXPECT_THAT(ErrorOf("{% include 'x' %}"), HasSubstr("unsupported tag 'include'"));
  EXPECT_THAT(ErrorOf("{% for x in y recursive %}{% endfor %}"),
              HasSubstr("unsupported: recursive loops"));
  EXPECT_THAT(ErrorOf("{% break %}"), HasSubstr("'break' outside of a loop"));
}

// ---- expressions --------------------------------------------------------------------------------

TEST(ChatTemplateTest, LiteralsAndOperators) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} "
              "{{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} "
              "{{ 2 not in [1, 3] }} {{ not true or false }} {{ 1 == 1.0 }} {{ [1, 2] + [3] }} "
              "{{ 'ab' * 2 }}"),
            "7 3 -4 1 2 3.5 1024 a1None True True True False True [1, 2, 3] abab");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 'y' and 'z' }} [{{ '' and 'z' }}]"), "x z []");
  EXPECT_EQ(R("{{ 'a' if true else 'b' }}{{ 'a' if false else 'b' }}[{{ 'a' if false }}]"), "ab[]");
  EXPECT_EQ(R("{{ \"d\\\"q\" }} {{ 'it\\'s' }} {{ 'tab\\there' }} {{ 'a\\\\b' }} {{ 'x\\ny' }}"),
            "d\"q it's tab\there a\\b x\ny");
  EXPECT_EQ(R("{{ 'a' 'b' }} {{ 1.5 }} {{ 2.0 }} {{ 1e3 }} {{ 0.1 }} {{ 1_000 }} {{ True }} "
              "{{ None }} {{ {'a': 'b'} }} {{ [] }} {{ 'x'[0] }}"),
            "ab 1.5 2.0 1000.0 0.1 1000 True None {'a': 'b'} [] x");
  // Jinja: ** is left-associative and binds looser than unary minus; ~ binds tighter than +.
  EXPECT_EQ(R("{{ 10 - 2 - 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 'a' ~ 2 * 3 }}"), "5 64 4 a6");
  EXPECT_THAT(ErrorOf("{{ 1 ~ 2 + 3 }}"), HasSubstr("unsupported operand type(s) for +"));
  EXPECT_THAT(ErrorOf("{{ 1 / 0 }}"), HasSubstr("division by zero"));
  EXPECT_THAT(ErrorOf("{{ 'a' + 1 }}"), HasSubstr("unsupported operand type(s) for +"));
  EXPECT_THAT(ErrorOf("{{ 9223372036854775807 + 1 }}"), HasSubstr("integer overflow"));
}

TEST(ChatTemplateTest, AttributesItemsAndSlices) {
  EXPECT_EQ(R("{{ [1,2,3,4][1:] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][-1] }} {{ [1,2,3,4][:-1] }} "
              "{{ [1,2,3,4][::2] }} {{ 'héllo'[1] }} [{{ [1,2,3][5] }}] {{ 'abc'[1:2] }} "
              "{{ [1,2,3,4,5][4:1:-2] }} {{ [1,2,3][-10:10] }}"),
            "[2, 3, 4] olleh 4 [1, 2, 3] [1, 3] é [] b [5, 3] [1, 2, 3]");
  EXPECT_EQ(R("{% set d = {'a': {'b': [10, 20]}} %}{{ d.a.b[1] }} {{ d['a']['b'].0 }} "
              "[{{ d.zz }}] [{{ d.a.zz.yy }}]"),
            "20 10 [] []");
  EXPECT_THAT(ErrorOf("{{ [1][::0] }}"), HasSubstr("slice step cannot be zero"));
}

TEST(ChatTemplateTest, Filters) {
  EXPECT_EQ(R("{{ '  x  ' | trim }}|{{ [1,2,3] | length }}|{{ 'héllo' | length }}|"
              "{{ 42 | string + 'x' }}|{{ 'hELLo wOrld' | lower }}|{{ 'hELLo wOrld' | upper }}|"
              "{{ 'hELLo wOrld' | capitalize }}|{{ 'hello world' | title }}"),
            "x|3|5|42x|hello world|HELLO WORLD|Hello world|Hello World");
  EXPECT_EQ(R("{{ nothing | default('dflt') }}|{{ '' | default('dflt') }}|"
              "{{ '' | default('dflt', true) }}|{{ none | default('x') }}|{{ nothing | d('y') }}"),
            "dflt||dflt|None|y");
  EXPECT_EQ(R("{{ ['a','b','c'] | join(', ') }}|{{ [1, 2] | join }}|{{ [1,2,3] | first }}"
              "{{ [1,2,3] | last }}|{{ 'ab' | list }}|{{ 'aXbXc' | replace('X', '-') }}|"
              "{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ 3.9 | int }}|{{ '2.5' | float }}|"
              "{{ [3, 1, 2] | sort }}|{{ [1, 2] | reverse | list }}|{{ -3 | abs }}|"
              "{{ 2.567 | round(2) }}"),
            "a, b, c|12|13|['a', 'b']|a-b-c|43|0|3|2.5|[1, 2, 3]|[2, 1]|3|2.57");
  EXPECT_EQ(R("{% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %}"), "a1");
  EXPECT_EQ(R("{{ 'a\\nb\\n' | indent(2) }}|{{ '<&>' | e }}|{{ [1, 2] | map('string') | join }}"),
            "a\n  b\n|&lt;&amp;&gt;|12");
}

// Jinja's min, max, unique and dictsort (Kimi-K3, Gemma 4, MiniCPM5, functionary v3.2 and
// Seed-OSS use them), the filter block (firefunction v2) and str.format (Hunyuan 3), as Jinja /
// Python give them.
TEST(ChatTemplateTest, MoreFiltersFilterBlocksAndFormat) {
  EXPECT_EQ(R("{{ [3, 1, 2] | min }}|{{ [3, 1, 2] | max }}|{{ ['b', 'A', 'c'] | min }}|"
              "{{ ['b', 'A', 'c'] | max(case_sensitive=true) }}|{{ [] | min }}|"
              "{{ [{'n': 2}, {'n': 5}] | max(attribute='n') }}"),
            "1|3|A|c||{'n': 5}");
  EXPECT_EQ(R("{{ [1, 2, 1, 3, 2] | unique | list }}|{{ ['a', 'A', 'b'] | unique | list }}|"
              "{{ ['a', 'A', 'b'] | unique(case_sensitive=true) | list }}"),
            "[1, 2, 3]|['a', 'b']|['a', 'A', 'b']");
  EXPECT_EQ(R("{% for k, v in {'b': 1, 'a': 2, 'C': 0} | dictsort %}{{ k }}{{ v }} {% endfor %}|"
              "{% for k, v in {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) %}"
              "{{ k }}{% endfor %}"),
            "a2 b1 C0 |ab");
  EXPECT_EQ(R("{% filter upper %}hello {{ 'world' }}{% endfilter %}|"
              "{%- filter trim | replace('a', 'b') -%}  banana  {%- endfilter %}"),
            "HELLO WORLD|bbnbnb");
  EXPECT_EQ(R("{% set x %}{% filter trim %}  kept  {% endfilter %}{% endset %}[{{ x }}]"),
            "[kept]");
  EXPECT_EQ(R("{{ '<a{}b>'.format(1) }}|{{ '{0}-{1}-{0}'.format('x', 'y') }}|"
              "{{ '{name}!'.format(name='hi') }}|{{ '{{}}{}'.format(2) }}"),
            "<a1b>|x-y-x|hi!|{}2");
  EXPECT_THAT(ErrorOf("{{ '{:>4}'.format(1) }}"), HasSubstr("unsupported field"));
  EXPECT_THAT(ErrorOf("{{ '{}{}'.format(1) }}"), HasSubstr("no argument for '{}'"));
  EXPECT_THAT(ErrorOf("{% filter nosuch %}x{% endfilter %}"), HasSubstr("unknown filter"));
  EXPECT_THAT(ErrorOf("{% filter upper %}{% break %}{% endfilter %}"), HasSubstr("outside"));
}

// from_json, llama.cpp's extension (DeepSeek V3.2's and V4's templates read a call's arguments
// given as JSON text with it): the JSON value, keys in order; bad JSON or a non-string errs.
TEST(ChatTemplateTest, FromJsonReadsJsonText) {
  EXPECT_EQ(R("{% set a = '{\"b\": [1, 2.5, null], \"a\": true}' | from_json %}"
              "{% for k, v in a.items() %}{{ k }}={{ v }};{% endfor %}{{ a.b[1] }}"),
            "b=[1, 2.5, None];a=True;2.5");
  EXPECT_EQ(R("{{ ('\"x\"' | from_json) ~ ('3' | from_json + 1) }}"), "x4");
  EXPECT_THAT(ErrorOf("{{ '{\"a\": ' | from_json }}"), HasSubstr("from_json"));
  EXPECT_THAT(ErrorOf("{{ 3 | from_json }}"), HasSubstr("not a string"));
}

// An assistant tool-call turn without content reaches the template as content none, as
// transformers passes it; a template that fails on that none (a string test or concatenation on
// every turn) gets the turn again with content "", as vLLM passes it. Other errors stand.
TEST(ChatTemplateTest, ToolCallTurnWithoutContent) {
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls = {{"c1", "f", "{}"}};
  const ChatTemplateInputs in = Inputs({{"user", "hi"}, call});
  EXPECT_EQ(*Render("{% for m in messages %}[{{ m.content is none }}]{% endfor %}", in),
            "[False][True]");
  EXPECT_EQ(*Render("{% for m in messages %}[{{ 'x' in m.content }}]{% endfor %}", in),
            "[False][False]");
  EXPECT_EQ(*Render("{% for m in messages %}{{ m.role + ':' + m.content + ';' }}{% endfor %}", in),
            "user:hi;assistant:;");
  // (The first error is the one reported when the retry fails too.)
  EXPECT_THAT(ErrorOf("{% for m in messages %}{% if m.tool_calls %}"
                      "{{ m.content + m.tool_calls[0].function.arguments }}{% endif %}{% endfor %}",
                      in),
              HasSubstr("'NoneType' and 'dict'"));
}

TEST(ChatTemplateTest, ToJson) {
  EXPECT_EQ(R("{{ {'a': 1, 'b': [true, none, 'x\"y\\n'], 'c': 1.5, 'é': 'ü'} | tojson }}"),
            "{\"a\": 1, \"b\": [true, null, \"x\\\"y\\n\"], \"c\": 1.5, \"é\": \"ü\"}");
  EXPECT_EQ(R("{{ {'a': [1, 2], 'b': {}} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(R("{{ 'é' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
  EXPECT_THAT(ErrorOf("{{ nothing | tojson }}"), HasSubstr("not JSON serializable"));
}

TEST(ChatTemplateTest, SelectAndMapOnMessages) {
  const ChatTemplateInputs in =
      Inputs({{"system", "s"}, {"user", "u1"}, {"assistant", "a"}, {"user", "u2"}});
  EXPECT_EQ(
      *Render("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
              "{{ messages | rejectattr('role', 'equalto', 'system') | map(attribute='content')"
              " | join('|') }}|{{ messages | selectattr('tool_calls', 'defined') | list }}|"
              "{{ messages | map(attribute='role') | first }}|{{ messages[-1].content }}",
              in),
      "2|u1|a|u2|[]|system|u2");
}

TEST(ChatTemplateTest, Tests) {
  EXPECT_EQ(R("{{ x is defined }}{{ x is not defined }}{{ none is none }}{{ 'a' is string }}"
              "{{ {} is mapping }}{{ [] is iterable }}{{ [] is sequence }}{{ 1 is number }}"
              "{{ 1.5 is number }}{{ true is true }}{{ false is false }}{{ 1 is true }}"
              "{{ 3 is equalto 3 }}{{ 3 is equalto(4) }}{{ 'a' is mapping }}{{ 4 is even }}"
              "{{ 9 is divisibleby 3 }}{{ range is callable }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueFalseFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ tools is none }}{{ tools is not none }}{{ documents is defined }}"),
            "TrueFalseTrue");
}

TEST(ChatTemplateTest, StringAndDictMethods) {
  EXPECT_EQ(R("{{ '  x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|"
              "{{ 'x  '.rstrip() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith('bc') }}|"
              "{{ 'a b  c'.split() }}|{{ 'a,b'.split(',') }}|{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|"
              "{{ 'hello world'.title() }}|{{ 'aaa'.replace('a', 'b', 2) }}|"
              "{{ '-'.join(['a', 'b']) }}|{{ 'a b c'.split(' ', 1) }}"),
            "x|hi|x|x|True|True|['a', 'b', 'c']|['a', 'b']|AB|ab|Hello World|bba|a-b|"
            "['a', 'b c']");
  EXPECT_EQ(R("{% set d = {'a': 1} %}{{ d.get('a') }}{{ d.get('b') }}{{ d.get('b', 2) }}"
              "{{ d.keys() | list }}{{ d.values() | list }}"),
            "1None2['a'][1]");
  EXPECT_THAT(ErrorOf("{{ [1].append(2) }}"), HasSubstr("has no method 'append'"));
}

TEST(ChatTemplateTest, UndefinedHandling) {
  EXPECT_EQ(R("[{{ nothing }}][{{ nothing.attr }}][{{ nothing['x'] }}]{{ nothing is defined }}"
              "{% if nothing %}T{% else %}F{% endif %}{{ nothing | length }}"),
            "[][][]FalseF0");
  EXPECT_EQ(R("[{{ messages[0]['role'] }}]"), "[]");
  EXPECT_EQ(ErrorOf("\n{{ nothing + 1 }}"), "chat_template: line 2: 'nothing' is undefined");
  EXPECT_THAT(ErrorOf("{{ nothing() }}"), HasSubstr("'nothing' is undefined"));
}

TEST(ChatTemplateTest, GlobalsAndRaise) {
  EXPECT_EQ(R("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}"),
            "[0, 1, 2] [1, 4, 7] [5, 3, 1]");
  EXPECT_EQ(R("{{ strftime_now('%Y-%m-%d %H:%M') }}"), "2024-09-05 12:00");
  EXPECT_EQ(R("{{ dict(a=1, b='x') }}"), "{'a': 1, 'b': 'x'}");
  absl::StatusOr<std::string> raised =
      Render("x{{ raise_exception('Bad thing: ' ~ 42) }}", Inputs({}));
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(raised.status().message(), "Bad thing: 42");
}

// ---- errors -------------------------------------------------------------------------------------

TEST(ChatTemplateTest, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(ErrorOf("hello\n{% if %}"), "chat_template: line 2 col 7: unexpected '%}'");
  EXPECT_EQ(ErrorOf("{{ x | nosuch }}"), "chat_template: line 1 col 8: unknown filter 'nosuch'");
  EXPECT_EQ(ErrorOf("{{ x is nosuch }}"), "chat_template: line 1 col 9: unknown test 'nosuch'");
  EXPECT_EQ(ErrorOf("{{ 'abc }}"), "chat_template: line 1 col 4: unterminated string");
  EXPECT_EQ(ErrorOf("{{ (1 + 2 }}"), "chat_template: line 1 col 11: unexpected '}'");
  EXPECT_EQ(ErrorOf("a\nb {% foo %}"), "chat_template: line 2 col 6: unknown tag 'foo'");
  EXPECT_THAT(ErrorOf("{% for x in y %}"),
              HasSubstr("unexpected end of template, expected 'endfor' or 'else'"));
  EXPECT_THAT(ErrorOf("{% endif %}"), HasSubstr("unexpected 'endif'"));
  EXPECT_THAT(ErrorOf("{{ x "), HasSubstr("unclosed '{{'"));
  EXPECT_THAT(ErrorOf("{# x "), HasSubstr("unclosed comment"));
  EXPECT_THAT(ErrorOf("{{ x $ y }}"), HasSubstr("unexpected character '$'"));
  EXPECT_THAT(ErrorOf("{{ f(a=1, 2) }}"), HasSubstr("positional argument follows keyword"));
  EXPECT_THAT(ErrorOf("{{ }}"), HasSubstr("unexpected '}}'"));
}

TEST(ChatTemplateTest, Bounds) {
  EXPECT_THAT(ErrorOf("{% for i in range(100000000) %}x{% endfor %}"),
              HasSubstr("range() too large"));
  EXPECT_THAT(ErrorOf("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                      "{% endfor %}"),
              HasSubstr("loop iterations"));
  EXPECT_THAT(ErrorOf("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}"),
              HasSubstr("output exceeds 4194304 bytes"));
  EXPECT_THAT(ErrorOf("{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
              HasSubstr("string exceeds"));
  EXPECT_THAT(ErrorOf("{{ 'x' * 100000000 }}"), HasSubstr("too large"));
  EXPECT_THAT(ErrorOf("{% set ns = namespace(s='x' * 4000000) %}{% for i in range(100000) %}"
                      "{% set t = ns.s ~ '' %}{% endfor %}"),
              HasSubstr("work limit"));
  EXPECT_THAT(ErrorOf("{% set ns = namespace(v=[]) %}{% for i in range(200) %}"
                      "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson }}"),
              HasSubstr("value nested too deep"));
  EXPECT_THAT(ErrorOf(std::string(2 * 1024 * 1024, 'x')), HasSubstr("template exceeds"));
}

TEST(ChatTemplateTest, DeepNestingFailsCleanly) {
  auto repeat = [](std::string_view s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (int n : {500, 30000}) {
    EXPECT_THAT(ErrorOf("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}"),
                HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ " + repeat("[", n) + repeat("]", n) + " }}"),
                HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf(repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n)),
                HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ " + repeat("not ", n) + "x }}"), HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ " + repeat("-", n) + "1 }}"), HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ 1" + repeat(" + 1", n) + " }}"), HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ x" + repeat(" | trim", n) + " }}"), HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ x" + repeat(".a", n) + " }}"), HasSubstr("nested too deep"));
    EXPECT_THAT(ErrorOf("{{ 1 if x else " + repeat("1 if x else ", n) + "2 }}"),
                HasSubstr("nested too deep"));
  }
  // Just inside the limits: parses, renders.
  EXPECT_EQ(R("{{ " + repeat("(", 40) + "1" + repeat(")", 40) + " }}"), "1");
  EXPECT_EQ(R(repeat("{% if true %}", 40) + "x" + repeat("{% endif %}", 40)), "x");
  // Macro recursion deep in nested blocks and expressions hits a bound, not the stack.
  EXPECT_THAT(ErrorOf("{% macro f(n) %}" + repeat("{% if true %}", 60) + "{{ " + repeat("(", 60) +
                      "f(n + 1)" + repeat(")", 60) + " }}" + repeat("{% endif %}", 60) +
                      "{% endmacro %}{{ f(0) }}"),
              HasSubstr("too deep"));
}

// ---- robustness ---------------------------------------------------------------------------------

TEST(ChatTemplateTest, RandomMutationsNeverCrash) {
  std::mt19937_64 rng(12345);
  const ChatTemplateInputs in = Inputs({{"system", "sys"},
                                        {"user", "hi"},
                                        {"assistant", "<think>x</think>hello"},
                                        {"tool", "42"},
                                        {"user", "bye"}});
  static const char* const kSnippets[] = {"{%",
                                          "%}",
                                          "{{",
                                          "}}",
                                          "{#",
                                          "#}",
                                          "-",
                                          "'",
                                          "\"",
                                          "(",
                                          ")",
                                          "[",
                                          "]",
                                          "{",
                                          "}",
                                          "|",
                                          " not ",
                                          " in ",
                                          " is ",
                                          "loop.",
                                          "|trim",
                                          "|tojson",
                                          " + ",
                                          " ~ ",
                                          "[-1]",
                                          "[::-1]",
                                          "{% endfor %}",
                                          "{% endif %}",
                                          "{% else %}",
                                          "{% for x in messages %}",
                                          ",",
                                          ".",
                                          ":",
                                          "\\",
                                          "\n",
                                          " if ",
                                          " else ",
                                          "range(",
                                          "namespace(",
                                          "raise_exception(",
                                          "\xff",
                                          "\xc3"};
  int parsed = 0, rendered = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string t = kAllTemplates[iter % std::size(kAllTemplates)];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !t.empty(); ++m) {
      const size_t pos = rng() % t.size();
      switch (rng() % 5) {
        case 0:
          t.resize(pos);
          break;  // truncate
        case 1:
          t[pos] = static_cast<char>(rng() % 256);
          break;  // random byte
        case 2:
          t[pos] = "{}%#-+'\"()[]|.,:~ \n"[rng() % 19];
          break;  // syntax byte
        case 3:
          t.insert(pos, kSnippets[rng() % std::size(kSnippets)]);
          break;
        case 4:
          t.erase(pos, 1 + rng() % 16);
          break;
      }
    }
    absl::StatusOr<ChatTemplate> parsed_template = ChatTemplate::Parse(t);
    if (!parsed_template.ok()) {
      EXPECT_EQ(parsed_template.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ++parsed;
    absl::StatusOr<std::string> out = parsed_template->Render(in);
    if (out.ok()) {
      ++rendered;
      EXPECT_LE(out->size(), ChatTemplate::kMaxOutputBytes);
    } else {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
    }
  }
  // The mutations leave a fair share of templates valid, so rendering is exercised too.
  EXPECT_GT(parsed, 200);
  EXPECT_GT(rendered, 100);
}

}  // namespace
}  // namespace kvrm
