#!/usr/bin/env bash
# Runs bench/offload_ttft.sh once on the tiny model against the built kvrmd and checks what it
# measures: with --prefix_cache_offload turn 2 finds turn 1's blocks (copied back from the host
# tier after the flush pushed them off the device), without it finds none, and with no flush it
# finds them on the device. The TTFT figures are recorded in docs/benchmarks.md from full runs.
set -euo pipefail
out="${TEST_TMPDIR}/offload.json"
bench/offload_ttft.sh --bin=. --model=builtin:tiny --model_cache="${TEST_TMPDIR}/models" \
  --rounds=1 --prompt=192 --followup=16 --flush=3 --json="$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rounds"][0]
assert r["offload_cached"] >= 176, f"offload: turn 2 found {r['offload_cached']} cached tokens"
assert r["no_offload_cached"] == 0, f"no offload: turn 2 found {r['no_offload_cached']}"
assert r["device_hit_cached"] >= 176, f"device hit: {r['device_hit_cached']}"
for k in ("offload_ttft_ms", "no_offload_ttft_ms", "device_hit_ttft_ms"):
    assert r[k] > 0, f"{k}: {r[k]}"
print("ok", r)
PY
