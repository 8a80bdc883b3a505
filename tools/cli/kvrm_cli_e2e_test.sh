#!/bin/bash
# kvrm_cli against a live kvrmd (the tiny built-in model): health, info, tokenize then detokenize
# back to the same text (with and without the BOS token spelt), greedy generation reproducible
# and equal through --prompt and through the --token_ids tokenize gave, a seeded sampled run
# reproducible, and a server-side refusal (a token id outside the vocabulary) as exit 1 naming
# INVALID_ARGUMENT.
set -u

RUNFILES="${TEST_SRCDIR:-.}/kvrm"
CLI="$RUNFILES/tools/cli/kvrm_cli"
KVRMD="$RUNFILES/server/kvrmd"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# check <description> <want> <got>
check() {
  [[ "$2" == "$3" ]] || fail "$1: got '$3', want '$2'"
}

"$KVRMD" --model=builtin:tiny --model_cache="$TMP/models" --listen=127.0.0.1:0 \
  --port_file="$TMP/port" --http_port=-1 --metrics_listen=127.0.0.1 --metrics_port=0 \
  --slots=2 --threads=2 --lora_modules=demo=builtin --max_loras=2 --allow_runtime_lora_updating \
  >"$TMP/kvrmd.log" 2>&1 &
KVRMD_PID=$!
trap 'kill -TERM $KVRMD_PID 2>/dev/null; wait $KVRMD_PID 2>/dev/null' EXIT
for _ in $(seq 1 1200); do
  [[ -s "$TMP/port" ]] && break
  kill -0 $KVRMD_PID 2>/dev/null || break
  sleep 0.1
done
if [[ ! -s "$TMP/port" ]]; then
  echo "kvrmd did not start:"
  tail -n 30 "$TMP/kvrmd.log"
  exit 1
fi
S="--server=127.0.0.1:$(cat "$TMP/port") --timeout_s=120"

# shellcheck disable=SC2086
run() { "$CLI" "$@" $S 2>"$TMP/err"; }

check "health" "SERVING" "$(run health)"
run info >"$TMP/info" || fail "info: exit $?"
grep -q "tiny" "$TMP/info" || fail "info names no model: $(head -c 300 "$TMP/info")"

TEXT="The capital of France is"
ids=$(run tokenize --text="$TEXT") || fail "tokenize: exit $?"
with_bos=$(run tokenize --text="$TEXT" --add_bos) || fail "tokenize --add_bos: exit $?"
n=$(wc -w <<<"$ids")
((n >= 2)) || fail "tokenize gave '$ids'"
check "BOS adds one token" "$((n + 1))" "$(wc -w <<<"$with_bos")"
check "detokenize of tokenize" "$TEXT" "$(run detokenize --tokens="$ids")"
check "detokenize, commas" "$TEXT" "$(run detokenize --tokens="${ids// /,}")"
spelt=$(run detokenize --tokens="$with_bos")
[[ "$spelt" == *"$TEXT" && ${#spelt} -gt ${#TEXT} ]] || fail "BOS not spelt: '$spelt'"
check "BOS skipped" "$TEXT" "$(run detokenize --tokens="$with_bos" --skip_special_tokens)"
json=$(run detokenize --tokens="$ids" --json)
[[ "$json" == *"\"text\""*"$TEXT"* ]] || fail "detokenize --json: '$json'"

# Embeddings: one line per input (token count, then the vector), unit length by default, the
# text's token count what tokenize --add_bos gives, 8 components with --dimensions=8.
emb=$(run embed --text="$TEXT" --text="Hello") || fail "embed: exit $?"
check "embed lines" "2" "$(wc -l <<<"$emb")"
check "embed token count" "$(wc -w <<<"$with_bos") tokens:" "$(head -1 <<<"$emb" | cut -d' ' -f1-2)"
norm=$(head -1 <<<"$emb" | cut -d: -f2 | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i * $i; printf "%.3f", s }')
check "embed unit length" "1.000" "$norm"
cut8=$(run embed --tokens="$ids" --dimensions=8 --pooling=mean) || fail "embed --dimensions: exit $?"
check "embed dimensions" "10" "$(wc -w <<<"$cut8")"
json=$(run embed --tokens="$ids" --json)
[[ "$json" == *"\"embeddings\""*"\"values\""* ]] || fail "embed --json: '${json:0:200}'"

# Scoring on a model without a classification head: embedding similarity, most relevant first
# (a text against itself scores 1); classify is refused, naming what is missing.
sc=$(run score --query="$TEXT" --document="Hello" --document="$TEXT") || fail "score: exit $?"
check "score lines" "2" "$(wc -l <<<"$sc")"
check "score first" "1.000000	1" "$(head -1 <<<"$sc" | cut -f1-2)"
if run classify --text="$TEXT" >/dev/null; then fail "classify without a head succeeded"; fi
grep -q "classification head" "$TMP/err" || fail "classify refusal: '$(cat "$TMP/err")'"

# Greedy: the same text twice, and the same from the prompt's ids (--token_ids adds no BOS, so
# they are given with it; --prompt adds it).
a=$(run generate --prompt="$TEXT" --max_new_tokens=12 --ignore_eos) || fail "generate: exit $?"
b=$(run generate --prompt="$TEXT" --max_new_tokens=12 --ignore_eos)
check "greedy twice" "$a" "$b"
c=$(run generate --token_ids="${with_bos// /,}" --max_new_tokens=12 --ignore_eos)
check "greedy from ids" "$a" "$c"
[[ -n "$a" ]] || fail "greedy generation is empty"
grep -q "finish=LENGTH prompt_tokens=$((n + 1)) completion_tokens=12" "$TMP/err" || fail "no summary line: $(cat "$TMP/err")"

# Prompt logprobs: one line per prompt token (BOS included, the first unscored) and the
# perplexity line; the completion itself is the greedy one above.
p=$(run generate --prompt="$TEXT" --max_new_tokens=12 --ignore_eos --prompt_logprobs=2)
check "greedy with prompt logprobs" "$a" "$p"
[[ $(grep -c "^prompt token " "$TMP/err") == $((n + 1)) ]] || fail "prompt lines: $(cat "$TMP/err")"
grep -q "^prompt: $n tokens scored, logprob sum -[0-9.]*, perplexity [0-9.]*$" "$TMP/err" \
  || fail "no perplexity line: $(cat "$TMP/err")"

s1=$(run generate --prompt="Once" --max_new_tokens=16 --temperature=0.9 --seed=11)
s2=$(run generate --prompt="Once" --max_new_tokens=16 --temperature=0.9 --seed=11)
check "seeded sampling twice" "$s1" "$s2"

run detokenize --tokens=1,99999999 >/dev/null
rc=$?
check "out-of-vocabulary exit" 1 "$rc"
grep -q "INVALID_ARGUMENT" "$TMP/err" || fail "no INVALID_ARGUMENT: $(cat "$TMP/err")"

# LoRA adapters: the built-in one's directory loaded again under another name answers as it
# does; info counts the slots; unloaded, the name is refused.
lora_dir=$(ls -d "$TMP"/models/lora-*-demo 2>/dev/null | head -n 1)
[[ -n "$lora_dir" ]] || fail "no built-in adapter directory under $TMP/models"
loaded=$(run load-lora --lora_name=again --lora_path="$lora_dir") || fail "load-lora: exit $?: $(cat "$TMP/err")"
[[ "$loaded" == "loaded LoRA adapter again (rank "* ]] || fail "load-lora said '$loaded'"
d=$(run generate --prompt="$TEXT" --max_new_tokens=12 --ignore_eos --lora_adapter=demo)
e=$(run generate --prompt="$TEXT" --max_new_tokens=12 --ignore_eos --lora_adapter=again)
check "the same adapter under two names" "$d" "$e"
[[ "$d" != "$a" ]] || fail "the adapter changed nothing: '$d'"
run info >"$TMP/info"
grep -q "2 of 2 taken" "$TMP/info" || fail "info's lora_slots: $(grep lora "$TMP/info")"
check "unload-lora" "unloaded LoRA adapter again" "$(run unload-lora --lora_name=again)"
run generate --prompt="$TEXT" --max_new_tokens=2 --lora_adapter=again >/dev/null
check "unloaded adapter exit" 1 "$?"
grep -q "INVALID_ARGUMENT" "$TMP/err" || fail "no INVALID_ARGUMENT: $(cat "$TMP/err")"
run load-lora --lora_name=x >/dev/null
check "load-lora without --lora_path" 2 "$?"

if ((failures > 0)); then
  echo "$failures failure(s); kvrmd log tail:"
  tail -n 20 "$TMP/kvrmd.log"
  exit 1
fi
echo "all kvrm_cli end-to-end checks passed"
