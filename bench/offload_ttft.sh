#!/usr/bin/env bash
# Time to first token of a conversation's next turn after other traffic pushed its first turn out
# of the device KV pool: kvrmd with --prefix_cache_offload on and off, side by side in one run
# (two servers on the same machine, requests one at a time, alternating between them).
#
# Each round: turn 1 (--prompt tokens, random ids), --flush other requests of the same length
# (together more than the device pool), then turn 2 (turn 1's prompt + --followup new tokens).
# With offload, turn 2 copies turn 1's blocks back from the host tier; without, it prefills them
# again. A last column, turn 2 with no flush between (the blocks still on the device), shows
# what a device hit costs.
#
#   bench/offload_ttft.sh [--rounds=5] [--prompt=1536] [--followup=64] [--flush=3]
#                         [--model=builtin:small] [--json=FILE]
#                         [--bin=DIR]           (kvrmd and kvrm_cli already built under DIR:
#                                                DIR/server/kvrmd, DIR/tools/cli/kvrm_cli)
#                         [--model_cache=DIR]   (kvrmd's, for built-in models)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5 prompt=1536 followup=64 flush=3 model=builtin:small json="" bin="" model_cache=""
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    --prompt=*) prompt=${arg#*=} ;;
    --followup=*) followup=${arg#*=} ;;
    --flush=*) flush=${arg#*=} ;;
    --model=*) model=${arg#*=} ;;
    --json=*) json=${arg#*=} ;;
    --bin=*) bin=${arg#*=} ;;
    --model_cache=*) model_cache=${arg#*=} ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

if [[ -z "$bin" ]]; then
  bazel build -c opt //server:kvrmd //tools/cli:kvrm_cli >/dev/null 2>&1 ||
    bazel build -c opt //server:kvrmd //tools/cli:kvrm_cli
  bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
fi
cache_flag=()
[[ -n "$model_cache" ]] && cache_flag=(--model_cache="$model_cache")
cli="$bin/tools/cli/kvrm_cli"
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"' EXIT

# The device pool: one max-context request (the floor kvrmd accepts) plus a little, so that the
# flush requests push turn 1 out; the host tier: room for everything.
blocks_per_request=$(((prompt + followup + 16 + 15) / 16))
max_context=$((blocks_per_request * 16 + 64))
kv_blocks=$(((max_context + 15) / 16 + 8))
start() {  # start NAME offload
  "$bin/server/kvrmd" --model="$model" --listen=127.0.0.1:0 --port_file="$work/$1.port" \
    --slots=2 --max_context="$max_context" --kv_blocks="$kv_blocks" \
    --kv_host_blocks=$((kv_blocks * 8)) --prefix_cache_offload="$2" --metrics_port=0 --http_port=-1 \
    "${cache_flag[@]}" >"$work/$1.log" 2>&1 &
  pids+=($!)
}
# One after the other: the first generates a built-in model if the cache lacks it.
for name in on off; do
  start "$name" "$([[ $name == on ]] && echo true || echo false)"
  for _ in $(seq 1 3000); do [[ -s "$work/$name.port" ]] && break; sleep 0.1; done
  [[ -s "$work/$name.port" ]] || { echo "kvrmd ($name) did not start:" >&2; cat "$work/$name.log" >&2; exit 1; }
done

ids() {  # ids SEED COUNT: COUNT random token ids, comma-separated
  python3 -c "import random,sys; r=random.Random(int(sys.argv[1])); print(','.join(str(r.randrange(10, 1000)) for _ in range(int(sys.argv[2]))))" "$1" "$2"
}
gen() {  # gen NAME IDS -> "ttft_ms cached_prompt_tokens"
  local line
  line=$("$cli" generate --server="127.0.0.1:$(cat "$work/$1.port")" --token_ids="$2" \
    --max_new_tokens=16 --ignore_eos 2>&1 >/dev/null | grep 'ttft_ms=' | tail -1)
  local ttft cached
  ttft=$(sed -n 's/.*ttft_ms=\([0-9.]*\).*/\1/p' <<<"$line")
  cached=$(sed -n 's/.*cached_prompt_tokens=\([0-9]*\).*/\1/p' <<<"$line")
  echo "${ttft:-nan} ${cached:-0}"
}

echo "kvrmd: $model, 2 slots, device pool $kv_blocks blocks ($((kv_blocks * 16)) tokens), host tier $((kv_blocks * 8)) blocks; prompt $prompt + $followup tokens, $flush flush requests"
printf "%-6s %-34s %-34s %-26s\n" round "turn 2 TTFT ms, offload (cached)" "turn 2 TTFT ms, no offload (cached)" "turn 2 TTFT ms, no flush"
results=()
for r in $(seq 1 "$rounds"); do
  turn1=$(ids $((1000 * r)) "$prompt")
  turn2="$turn1,$(ids $((1000 * r + 1)) "$followup")"
  declare -A t2 c2
  for name in on off; do
    gen "$name" "$turn1" >/dev/null
    for f in $(seq 1 "$flush"); do gen "$name" "$(ids $((1000 * r + 100 + f)) "$prompt")" >/dev/null; done
    read -r t2[$name] c2[$name] < <(gen "$name" "$turn2")
  done
  # No flush: turn 1 again under a fresh id stream's neighbour, then turn 2 at once (device hit).
  turn1b=$(ids $((1000 * r + 500)) "$prompt")
  gen on "$turn1b" >/dev/null
  read -r t2_hot c2_hot < <(gen on "$turn1b,$(ids $((1000 * r + 501)) "$followup")")
  printf "%-6s %-34s %-34s %-26s\n" "$r" "${t2[on]} (${c2[on]})" "${t2[off]} (${c2[off]})" "$t2_hot ($c2_hot)"
  results+=("{\"round\": $r, \"offload_ttft_ms\": ${t2[on]}, \"offload_cached\": ${c2[on]}, \"no_offload_ttft_ms\": ${t2[off]}, \"no_offload_cached\": ${c2[off]}, \"device_hit_ttft_ms\": $t2_hot, \"device_hit_cached\": $c2_hot}")
done
"$cli" info --server="127.0.0.1:$(cat "$work/on.port")" | grep -i "prefix" || true
if [[ -n "$json" ]]; then
  {
    echo "{\"model\": \"$model\", \"prompt\": $prompt, \"followup\": $followup, \"flush\": $flush,"
    echo " \"kv_blocks\": $kv_blocks, \"kv_host_blocks\": $((kv_blocks * 8)), \"rounds\": ["
    (IFS=$',\n'; echo "${results[*]}")
    echo "]}"
  } >"$json"
  echo "wrote $json"
fi
