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
source tools/test_results.sh
count_test_results "$log" "$testlogs" "$bazel_rc"
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 && $bazel_rc -eq 0 ]]
