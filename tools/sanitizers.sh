#!/usr/bin/env bash
# Runs the unit and end-to-end tests under a sanitizer and prints "N passed, N failed":
#
#   tools/sanitizers.sh tsan [BAZEL_TEST_ARGS...]   ThreadSanitizer (--config=tsan)
#   tools/sanitizers.sh asan [BAZEL_TEST_ARGS...]   AddressSanitizer + UBSan (--config=asan)
#
# Before building, a tiny racy (tsan) or overflowing (asan) program is compiled with the same
# compiler and run, to check that the sanitizer works on this machine and still reports. Kernels
# with high ASLR entropy (vm.mmap_rnd_bits=32, e.g. Linux 6.6+ defaults) make gcc 12's runtimes
# crash before main ("FATAL: ThreadSanitizer: unexpected memory mapping", google/sanitizers#1716);
# newer LLVM runtimes re-exec themselves without ASLR, gcc 12's do not. When the probe crashes
# natively but works under `setarch $(uname -m) -R` (ASLR off for that process and its children),
# every test runs that way (--run_under); nothing system-wide is changed.
#
# Targets: everything under common/ model/ runtime/ kernels/ server/ metrics/ tests/ tools/.
# Left out: //fuzz:fuzz_test (libFuzzer + ASan by construction), //bench (speed smoke tests) and
# //deploy (manifest and Dockerfile checks, no C++). Timeouts are raised (TSan runs the engine
# 5-15x slower). Environment: KVRM_BAZEL_OUTPUT_BASE=DIR runs bazel with --output_base=DIR;
# KVRM_SANITIZER_SETARCH=1 forces the setarch wrapper, =0 forbids it.
# Exit status: non-zero when anything failed (or the sanitizer does not work here).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

mode=${1:-}
case "$mode" in
  tsan|asan) shift ;;
  *) echo "usage: tools/sanitizers.sh tsan|asan [bazel test args...]" >&2; exit 2 ;;
esac

bash tools/setup.sh || exit 1

bazel=(bazel)
if [[ -n "${KVRM_BAZEL_OUTPUT_BASE:-}" ]]; then bazel+=("--output_base=$KVRM_BAZEL_OUTPUT_BASE"); fi

# ---- probe: does the sanitizer run (natively, or with ASLR off) and report? --------------------
probe_dir=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$probe_dir" "$log"' EXIT
if [[ $mode == tsan ]]; then
  cat >"$probe_dir/probe.cc" <<'EOF'
#include <thread>
int counter = 0;
int main() {
  std::thread a([] { ++counter; }), b([] { ++counter; });
  a.join();
  b.join();
  return counter == 2 ? 0 : 1;
}
EOF
  flags=(-fsanitize=thread -O1 -g -pthread)
  expect='WARNING: ThreadSanitizer: data race'
else
  cat >"$probe_dir/probe.cc" <<'EOF'
#include <cstdlib>
int main(int argc, char**) {
  int* p = static_cast<int*>(std::malloc(4 * sizeof(int)));
  int v = p[argc + 3];  // one past the end
  std::free(p);
  return v;
}
EOF
  flags=(-fsanitize=address,undefined -O1 -g)
  expect='ERROR: AddressSanitizer: heap-buffer-overflow'
fi
if ! g++ "${flags[@]}" "$probe_dir/probe.cc" -o "$probe_dir/probe" 2>"$probe_dir/cc.log"; then
  echo "sanitizers: cannot build a $mode program:" >&2
  cat "$probe_dir/cc.log" >&2
  exit 1
fi
setarch_cmd=(setarch "$(uname -m)" -R)
probe_ok() { "$@" "$probe_dir/probe" >"$probe_dir/run.log" 2>&1; grep -q "$expect" "$probe_dir/run.log"; }
run_under=()
if [[ "${KVRM_SANITIZER_SETARCH:-}" == 1 ]]; then
  probe_ok "${setarch_cmd[@]}" || { cat "$probe_dir/run.log" >&2; exit 1; }
  run_under=(--run_under="${setarch_cmd[*]}")
elif probe_ok; then
  echo "sanitizers: $mode works natively (vm.mmap_rnd_bits=$(sysctl -n vm.mmap_rnd_bits 2>/dev/null || echo '?'))"
elif [[ "${KVRM_SANITIZER_SETARCH:-}" != 0 ]] && probe_ok "${setarch_cmd[@]}"; then
  echo "sanitizers: $mode crashes with ASLR on (vm.mmap_rnd_bits=$(sysctl -n vm.mmap_rnd_bits 2>/dev/null || echo '?')); running the tests under '${setarch_cmd[*]}'"
  run_under=(--run_under="${setarch_cmd[*]}")
else
  echo "sanitizers: a $mode program does not run on this machine, even with ASLR off:" >&2
  head -20 "$probe_dir/run.log" >&2
  exit 1
fi
if [[ ${#run_under[@]} -gt 0 ]]; then echo "sanitizers: tests run under ${setarch_cmd[*]}"; fi

# ---- the tests ------------------------------------------------------------------------------------
args=(--config="$mode" --keep_going --test_tag_filters=-fuzz --test_summary=short
      --test_timeout=300,900,2700,3600)
# Deadlines inside tests (a Generate call's 120 s, kvrm_replay's 60 s per request) are sized for
# a plain build; a sanitizer on a busy 2-core machine needs more (tests/test_server.h).
if [[ $mode == tsan ]]; then args+=(--test_env=KVRM_TEST_TIMEOUT_SCALE=5); else args+=(--test_env=KVRM_TEST_TIMEOUT_SCALE=2); fi
if [[ $mode == tsan ]]; then
  # halt_on_error=0: a test reports every race it meets and then exits 66 (so it fails).
  # ignore_noninstrumented_modules=1: Debian's gRPC, Abseil, Protobuf and OpenSSL are not built
  # with TSan, so it cannot see their internal synchronisation (absl::Mutex, atomics); memory
  # accesses that their calls into libc make (memcpy, free, ...) would otherwise be reported as
  # races by the thousand. Their pthread synchronisation is still seen, and all of kvrm is checked.
  # Suppressions (tools/tsan.supp) are for proven false positives in those libraries' inline
  # header code only; each entry there says why.
  # One test at a time: TSan makes the engine 5-15x slower, and two at once on a small machine
  # starve each other (replay_e2e_test's requests ran past their deadline: no race, just time).
  args+=(--local_test_jobs=1)
  args+=("--test_env=TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1:history_size=4:ignore_noninstrumented_modules=1:suppressions=$root/tools/tsan.supp")
fi
targets=(//common/... //model/... //runtime/... //kernels/... //server/... //metrics/...
         //tests/... //tools/...)
"${bazel[@]}" test "${args[@]}" "${run_under[@]}" "$@" -- "${targets[@]}" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

# ---- "N passed, N failed", counted as tools/test.sh counts (tools/test_results.sh) ---------------
testlogs=$("${bazel[@]}" info --config="$mode" bazel-testlogs 2>/dev/null)
source "$root/tools/test_results.sh"
count_test_results "$log" "$testlogs" "$bazel_rc"
races=$(grep -c '^WARNING: ThreadSanitizer' "$log" || true)
if [[ $mode == tsan ]]; then echo "sanitizers: $races ThreadSanitizer reports in failing tests' logs"; fi
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 && $bazel_rc -eq 0 ]]
