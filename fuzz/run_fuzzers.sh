#!/usr/bin/env bash
# Builds (fuzz/build_fuzzers.sh) and runs every libFuzzer target for SECONDS each (default 60),
# starting from its seed corpus in fuzz/corpus/<target>/. Exits 1 when any target crashes,
# leaks, times out on one input or breaks an invariant; the input that did it is kept as
# $OUT/artifacts/<target>-crash-<sha1> (reproduce: $OUT/bin/<target> <that file>).
#
#   fuzz/run_fuzzers.sh [SECONDS] [TARGET...]
#
# Env: KVRM_FUZZ_OUT (build and work dir, default ${TMPDIR:-/tmp}/kvrm-fuzz), CXX (clang++).
# Longer runs: fuzz/run_fuzzers.sh 3600 (the working corpus in $OUT/corpus/ grows across runs).
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
out="${KVRM_FUZZ_OUT:-${TMPDIR:-/tmp}/kvrm-fuzz}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(safetensors_fuzzer tokenizer_fuzzer trace_fuzzer request_validation_fuzzer
    sampler_fuzzer chat_template_fuzzer structured_output_fuzzer tool_calls_fuzzer
    openai_request_fuzzer gguf_fuzzer lora_fuzzer)
fi

bash fuzz/build_fuzzers.sh "$out" || { echo "fuzz: build failed"; exit 1; }
mkdir -p "$out/artifacts"
export KVRM_FUZZ_ROOT="$PWD"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/fuzz/known_issues.supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t"
  log="$out/$t.log"
  echo "fuzz: $t for ${seconds}s"
  # New inputs go to the working corpus (first dir); the seed corpus is only read.
  "$out/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
    "$out/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  stats=$(grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" | awk '{print $2}' |
    paste -sd' ')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if ((rc != 0)); then
    echo "fuzz: $t FAILED (rc $rc); last lines of $log:"
    tail -40 "$log"
    failed+=("$t")
  else
    echo "fuzz: $t ok: ${stats% *} runs, ${cov:-cov: ?} edges, peak RSS ${stats##* } MB"
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s without a crash"
