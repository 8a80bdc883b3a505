#!/usr/bin/env bash
# The main job: installs what is missing, builds kvrmd and the client, starts kvrmd on the
# built-in model (generated on first run into ~/.cache/kvrm/models), streams a demo completion,
# then keeps serving on localhost:50051 (gRPC) and localhost:8000 (the OpenAI-compatible HTTP
# API) until Ctrl-C (SIGTERM/SIGINT drain it cleanly).
#
#   tools/demo.sh            # serve after the demo
#   tools/demo.sh --once     # stop after the demo request
#   KVRM_MODEL=/path/to/hf-model tools/demo.sh   # serve another Llama-family model
set -euo pipefail
cd "$(dirname "$0")/.."

once=0
[[ "${1:-}" == "--once" ]] && once=1
port="${KVRM_PORT:-50051}"
http_port="${KVRM_HTTP_PORT:-8000}"
model="${KVRM_MODEL:-builtin:small}"

bash tools/setup.sh
bazel build //server:kvrmd //tools/cli:kvrm_cli
bin="$(bazel info bazel-bin 2>/dev/null)"

port_file="$(mktemp)"
rm -f "$port_file"
# A LoRA adapter beside the model, generated for it (LoRA runs on the CPU device: not where kvrmd
# would pick a GPU).
lora=()
if [[ ! -e /dev/nvidia0 ]]; then lora=(--lora_modules=demo-lora=builtin); fi
"$bin/server/kvrmd" --model="$model" --listen="127.0.0.1:${port}" --port_file="$port_file" \
  --http_listen=127.0.0.1 --http_port="$http_port" --served_model_name=kvrm "${lora[@]}" &
kvrmd_pid=$!
trap 'kill -TERM $kvrmd_pid 2>/dev/null; wait $kvrmd_pid 2>/dev/null; rm -f "$port_file"' EXIT

for _ in $(seq 1 600); do
  [[ -s "$port_file" ]] && break
  if ! kill -0 $kvrmd_pid 2>/dev/null; then echo "kvrmd exited during start-up" >&2; exit 1; fi
  sleep 0.1
done
[[ -s "$port_file" ]] || { echo "kvrmd did not start" >&2; exit 1; }

cli="$bin/tools/cli/kvrm_cli"
echo
"$cli" info --server="127.0.0.1:${port}"
echo
echo "== demo request: greedy, 64 tokens =="
"$cli" generate --server="127.0.0.1:${port}" \
  --prompt="The history of the printing press begins" --max_new_tokens=64
echo
if ((${#lora[@]} > 0)); then
  echo "== demo request: the same, with the LoRA adapter demo-lora (a random one: other text) =="
  "$cli" generate --server="127.0.0.1:${port}" --lora_adapter=demo-lora \
    --prompt="The history of the printing press begins" --max_new_tokens=64
  echo
fi
echo "== demo request: sampled (temperature 0.8, top_p 0.95, seed 7) =="
"$cli" generate --server="127.0.0.1:${port}" --prompt="Once upon a time" \
  --max_new_tokens=48 --temperature=0.8 --top_p=0.95 --seed=7
echo
echo "== demo request: chat, rendered by the model's chat template =="
"$cli" generate --server="127.0.0.1:${port}" --system="You are a helpful assistant." \
  --message="user:What does a KV cache hold?" --max_new_tokens=48 ||
  echo "(no chat: the model has no chat template; see kvrmd --chat_template)"
echo
echo "== demo request: structured output, a JSON Schema (sampled, seed 3) =="
"$cli" generate --server="127.0.0.1:${port}" --prompt="A person, as JSON:" \
  --max_new_tokens=96 --temperature=0.9 --seed=3 \
  --json_schema='{"type":"object","properties":{"name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,"maximum":120},"city":{"enum":["Paris","Lagos","Lima","Osaka"]}},"required":["name","age","city"]}'
echo
echo "== demo request: tool calling, the model must call a function (sampled, seed 5) =="
"$cli" generate --server="127.0.0.1:${port}" --message="user:Weather in Lima?" \
  --max_new_tokens=64 --temperature=0.9 --seed=5 --tool_choice=required \
  --tools='[{"type":"function","function":{"name":"get_weather","description":"Forecast.","parameters":{"type":"object","properties":{"city":{"enum":["Lima","Oslo"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city"]}}}]'
echo
echo "== demo request: embeddings (last-token pooling, normalized; 8 of each vector's components) =="
"$cli" embed --server="127.0.0.1:${port}" --text="A cat sits on the mat." \
  --text="A dog sleeps on the rug." --dimensions=8
echo
echo "== demo request: reranking (this model has no classification head: embedding similarity) =="
"$cli" score --server="127.0.0.1:${port}" --query="A cat sits on the mat." \
  --document="Stock prices fell sharply." --document="A cat is sitting on a mat." \
  --document="A dog sleeps on the rug."
echo
echo "== demo request: the OpenAI-compatible HTTP API (POST /v1/chat/completions) =="
curl -sS "http://127.0.0.1:${http_port}/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "kvrm", "messages": [{"role": "user", "content": "What does a KV cache hold?"}], "max_tokens": 24, "temperature": 0}'
echo
echo

if [[ $once -eq 1 ]]; then exit 0; fi
echo "kvrmd is serving on 127.0.0.1:${port} (gRPC) and http://127.0.0.1:${http_port}/v1 (OpenAI API)"
echo "(Ctrl-C to stop). Try:"
echo "  $cli generate --server=127.0.0.1:${port} --prompt='Hello' --max_new_tokens=32"
echo "  curl -N http://127.0.0.1:${http_port}/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 32, \"stream\": true}'"
echo "  curl http://127.0.0.1:${http_port}/v1/embeddings -d '{\"input\": [\"Hello\", \"Bonjour\"]}'"
echo "  curl http://127.0.0.1:${http_port}/v1/rerank -d '{\"query\": \"Hello\", \"documents\": [\"Hi\", \"Bye\"]}'"
echo "  curl http://127.0.0.1:${http_port}/v1/messages -d '{\"max_tokens\": 32, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'   # Anthropic's API"
wait $kvrmd_pid
