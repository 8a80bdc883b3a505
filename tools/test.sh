#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`, then prints one plain
# summary line "N passed, N failed" counting test cases (GoogleTest cases from each target's
# test.xml; a target that fails to build or times out counts as one failed case).
# Exit status: non-zero when anything failed. Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... --keep_going --test_summary=short "$@" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

testlogs=$(bazel info bazel-testlogs 2>/dev/null)
passed=0
failed=0
while read -r target status; do
  xml="$testlogs/${target#//}"
  xml="${xml/://}/test.xml"
  case "$status" in
    PASSED|FAILED|FLAKY)
      if [[ -f "$xml" ]]; then
        line=$(grep -m1 -o '<testsuites[^>]*>' "$xml" || true)
        tests=$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' <<<"$line")
        fails=$(sed -n 's/.* failures="\([0-9]*\)".*/\1/p' <<<"$line")
        errors=$(sed -n 's/.* errors="\([0-9]*\)".*/\1/p' <<<"$line")
        if [[ -n "$tests" ]]; then
          bad=$(( ${fails:-0} + ${errors:-0} ))
          if [[ "$status" == FAILED && $bad -eq 0 ]]; then bad=1; fi
          passed=$(( passed + tests - bad ))
          failed=$(( failed + bad ))
          continue
        fi
      fi
      # A test without GoogleTest XML (a shell test) counts as one case.
      if [[ "$status" == FAILED ]]; then failed=$((failed + 1)); else passed=$((passed + 1)); fi
      ;;
    *)
      failed=$((failed + 1))
      ;;
  esac
done < <(awk '/^\/\/[^ ]+ +/ {
    status = "";
    if ($0 ~ /FAILED TO BUILD/) status = "BUILD_FAILED";
    else if ($0 ~ /NO STATUS/) status = "NO_STATUS";
    else if ($0 ~ / PASSED /) status = "PASSED";
    else if ($0 ~ / FLAKY/) status = "FLAKY";
    else if ($0 ~ / TIMEOUT/) status = "TIMEOUT";
    else if ($0 ~ / FAILED /) status = "FAILED";
    else if ($0 ~ / INCOMPLETE/) status = "INCOMPLETE";
    if (status != "") print $1, status;
  }' "$log" | sort -u)

if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then
  # Bazel failed before any test ran (a build error outside test targets).
  failed=1
fi
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 && $bazel_rc -eq 0 ]]
