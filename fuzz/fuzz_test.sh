#!/usr/bin/env bash
# //fuzz:fuzz_test: builds the libFuzzer targets and runs each for ${KVRM_FUZZ_SECONDS:-30} s
# (fuzz/run_fuzzers.sh) on a copy of the runfiles tree. Prints SKIPPED and passes where clang or
# libFuzzer is not installed (Debian: apt-get install clang libclang-rt-14-dev).
set -uo pipefail
if ! command -v "${CXX:-clang++}" >/dev/null ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
     "${CXX:-clang++}" -x c++ -fsanitize=fuzzer,address - -o "$TEST_TMPDIR/probe" 2>/dev/null; then
  echo "SKIPPED: clang++ with libFuzzer (-fsanitize=fuzzer) is not available"
  exit 0
fi
src="$TEST_TMPDIR/src"
mkdir -p "$src"
cp -rL common model proto runtime server fuzz "$src/"
mkdir -p "$src/kernels/cpu"
cp -L kernels/cpu/fast_math.h kernels/cpu/isa.h kernels/cpu/q4_k.cc kernels/cpu/q4_k.h \
  kernels/cpu/q8_0.cc kernels/cpu/q8_0.h \
  kernels/cpu/weight_matrix.h "$src/kernels/cpu/"
mkdir -p "$src/tools/replay"
cp -L tools/replay/trace.cc tools/replay/trace.h "$src/tools/replay/"
export KVRM_FUZZ_OUT="$TEST_TMPDIR/fuzz"
exec bash "$src/fuzz/run_fuzzers.sh" "${KVRM_FUZZ_SECONDS:-30}"
