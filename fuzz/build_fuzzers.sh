#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang: -fsanitize=fuzzer,address,undefined.
#
#   fuzz/build_fuzzers.sh [OUT]     # OUT defaults to ${KVRM_FUZZ_OUT:-${TMPDIR:-/tmp}/kvrm-fuzz}
#
# Plain clang++ rather than Bazel: switching Bazel's toolchain to clang would rebuild everything
# in another configuration, offline. The sources below are the transitive sources of the four
# libraries under test (`bazel query 'kind("source file", deps(//model:safetensors + //model:gguf_model +
# //model:tokenizer + //model:lora + //model:chat_template + //model:tool_calls + //tools/replay:trace +
# //server:request_validation + //server:openai_api))'`, runtime/structured/ by a glob); keep this list,
# and the data of //fuzz:fuzz_test, in step with it. System libraries (absl, protobuf, ICU,
# oniguruma) are linked uninstrumented. Objects are rebuilt when their source, or any header, is
# newer.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-${KVRM_FUZZ_OUT:-${TMPDIR:-/tmp}/kvrm-fuzz}}"
CXX="${CXX:-clang++}"
BUILTINS=()
SOURCES=(
  common/json.cc common/logging.cc common/mapped_file.cc common/siphash.cc
  kernels/cpu/q4_k.cc kernels/cpu/q8_0.cc
  model/safetensors.cc
  model/config.cc model/lora.cc model/weights.cc model/gpt_oss.cc model/quantized_checkpoint.cc
  model/gguf.cc
  model/gguf_model.cc model/gguf_quants.cc
  model/gguf_tokenizer.cc
  model/chat_config.cc model/chat_template.cc model/chat_template_parser.cc
  model/chat_template_value.cc
  model/tokenizer.cc model/tokenizer_added.cc model/tokenizer_bpe.cc model/tokenizer_decoder.cc
  model/tokenizer_normalizer.cc model/tokenizer_postprocessor.cc
  model/tokenizer_pretokenizer.cc model/tokenizer_text.cc model/tool_calls.cc
  model/tool_call_markup.cc model/pythonic_calls.cc model/reasoning.cc model/harmony.cc
  runtime/sampler.cc runtime/sampler_kernels.cc
  server/openai_api.cc server/request_validation.cc server/responses_api.cc server/messages_api.cc
  tools/replay/trace.cc
)
# Structured outputs (request validation compiles constraints): every library source there.
for src in runtime/structured/*.cc; do
  [[ "$src" == *_test.cc ]] || SOURCES+=("$src")
done
FUZZERS=(safetensors_fuzzer tokenizer_fuzzer trace_fuzzer request_validation_fuzzer sampler_fuzzer
  chat_template_fuzzer structured_output_fuzzer tool_calls_fuzzer openai_request_fuzzer gguf_fuzzer
  lora_fuzzer)

mkdir -p "$out/gen" "$out/obj" "$out/bin"
# Only the message classes are needed (request validation); no gRPC stubs.
if [[ ! "$out/gen/kvrm/v1/kvrm.pb.cc" -nt proto/kvrm/v1/kvrm.proto ]]; then
  protoc -Iproto --cpp_out="$out/gen" proto/kvrm/v1/kvrm.proto
fi

# vptr checks need RTTI from instrumented code only; the system libraries are not. UB is fatal,
# except signed overflow, which is recoverable only so fuzz/known_issues.supp can list reported,
# still unfixed findings (run_fuzzers.sh halts on every other report).
CXXFLAGS=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
  -fno-sanitize=vptr -fno-sanitize-recover=undefined -fsanitize-recover=signed-integer-overflow
  -Wno-deprecated-declarations
  -I. -I"$out/gen")
# clang < 15 has no x86 _Float16 (common/dtype.h uses it for float -> f16 rounding); __fp16 is
# clang's storage-only half type on every target and converts with the same rounding.
if ! echo '_Float16 h(float f) { return f; }' | "$CXX" -x c++ -fsyntax-only - 2>/dev/null; then
  CXXFLAGS+=(-D_Float16=__fp16)
  # Its float -> half conversion calls compiler-rt's __gnu_f2h_ieee (GGUF's block scales).
  BUILTINS=("$("$CXX" -rtlib=compiler-rt -print-libgcc-file-name)")
fi
ABSL_PC=(absl_flags absl_status absl_statusor absl_str_format absl_strings absl_synchronization
  absl_time absl_hash absl_raw_hash_set absl_cord absl_random_random)
read -r -a LIBS <<<"$(pkg-config --libs "${ABSL_PC[@]}" protobuf oniguruma icu-uc icu-i18n)"
LIBS+=("${BUILTINS[@]}")

# Headers are not tracked per object: one newer than an object rebuilds it (a class that grew a
# member must not meet objects compiled against its old layout).
newest_header=$(find common model runtime server tools/replay kernels/cpu fuzz -name '*.h' \
  -printf '%T@\n' | sort -n | tail -1)
compile() {  # src obj
  local obj_time=0
  [[ -e "$2" ]] && obj_time=$(stat -c '%.Y' "$2")
  if [[ ! "$2" -nt "$1" ]] || awk -v o="$obj_time" -v h="$newest_header" 'BEGIN { exit !(o < h) }'; then
    mkdir -p "$(dirname "$2")"
    echo "  CXX $1"
    "$CXX" "${CXXFLAGS[@]}" -c "$1" -o "$2"
  fi
}

objs=()
jobs=()
for src in "${SOURCES[@]}" "$out/gen/kvrm/v1/kvrm.pb.cc"; do
  obj="$out/obj/$(echo "${src#"$out/gen/"}" | tr / _).o"
  objs+=("$obj")
  compile "$src" "$obj" &
  jobs+=($!)
  # Two at a time: CI machines and laptops alike.
  if (( ${#jobs[@]} >= ${KVRM_FUZZ_JOBS:-2} )); then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
done
for j in "${jobs[@]}"; do wait "$j"; done

for f in "${FUZZERS[@]}"; do
  compile "fuzz/$f.cc" "$out/obj/fuzz_$f.o"
  echo "  LINK $out/bin/$f"
  "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer "$out/obj/fuzz_$f.o" "${objs[@]}" "${LIBS[@]}" \
    -lpthread -o "$out/bin/$f"
done
echo "fuzzers built in $out/bin"
