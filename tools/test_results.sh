# Sourced by tools/test.sh and tools/sanitizers.sh: counts the test cases of a `bazel test` run.
#
#   count_test_results LOG TESTLOGS BAZEL_RC   # sets $passed and $failed
#
# LOG is the run's output (its per-target summary lines), TESTLOGS the bazel-testlogs folder.
# GoogleTest cases come from each target's test.xml; a target without one (a shell test) counts
# as one case; a target that failed to build, timed out or has no status counts as one failed
# case; a FAILED target whose cases all passed (a sanitizer report, a crash at exit) counts one.
# Bazel failing before any test ran counts one failed case.
count_test_results() {
  local log=$1 testlogs=$2 bazel_rc=$3 target status xml line tests fails errors bad
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
  if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi
}
