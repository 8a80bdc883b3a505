#!/usr/bin/env bash
# Runs the KV runtime benchmark briefly (tiny model) and checks it writes its JSON with every
# section; the figures themselves are recorded in docs/benchmarks.md from full runs.
set -euo pipefail
out="${TEST_TMPDIR}/kv.json"
bench/kv_runtime_bench --quick --model_dir="${TEST_TMPDIR}/models" --json="$out" \
  --mooncake=tools/replay/testdata/mooncake_conversations.jsonl >/dev/null
for key in descriptor planner reserved decode_step_seconds_16_slots prefix_cache hit_rate; do
  grep -q "\"$key\"" "$out" || { echo "missing $key in $out"; exit 1; }
done
echo ok
