#!/usr/bin/env bash
# Smoke test of //bench:metrics_bench: it runs, and one histogram observation stays under 500 ns
# (10x the 50 ns budget; the budget itself is checked on a quiet machine, see docs/metrics.md).
set -euo pipefail
out=$(bench/metrics_bench --benchmark_filter='BM_HistogramObserve$' --benchmark_min_time=0.05 \
  --benchmark_format=json)
ns=$(echo "$out" | sed -n 's/.*"cpu_time": \([0-9.e+]*\).*/\1/p' | head -1)
unit=$(echo "$out" | sed -n 's/.*"time_unit": "\([a-z]*\)".*/\1/p' | head -1)
echo "BM_HistogramObserve: ${ns} ${unit}"
[[ "$unit" == "ns" ]] || { echo "unexpected time unit '$unit'"; exit 1; }
awk -v t="$ns" 'BEGIN { exit !(t > 0 && t < 500) }' || { echo "too slow: ${ns} ns"; exit 1; }
