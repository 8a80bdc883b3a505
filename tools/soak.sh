#!/usr/bin/env bash
# Soak: replays real traffic (the Azure conversation trace, lengths scaled to the tiny model)
# against kvrmd for a fixed time under KV pressure, then checks the invariants: every slot and
# block free, nothing in the host tier, nothing failed, and resident memory flat (RSS at the end
# within 10 % of RSS after the first two minutes).
#
#   tools/soak.sh [SECONDS]   # default 600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
bazel build //server:kvrmd //tools/replay:kvrm_replay //tools/cli:kvrm_cli >/dev/null
bin="$(bazel info bazel-bin 2>/dev/null)"
work="$(mktemp -d)"
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT

"$bin/server/kvrmd" --model=builtin:tiny --model_cache="$work/models" --listen=127.0.0.1:0 \
  --port_file="$work/port" --metrics_listen=127.0.0.1 --metrics_port=0 --http_port=-1 --slots=8 \
  --kv_blocks=120 --kv_block_tokens=8 --kv_max_runs=4 --max_queue=64 --threads=2 \
  --log_level=warning 2>"$work/kvrmd.log" &
pid=$!
for _ in $(seq 1 600); do [[ -s "$work/port" ]] && break; sleep 0.1; done
port="$(cat "$work/port")"
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }

# The trace's first `seconds` of arrivals at their own pace, lengths x0.1 (tiny model, 512 ctx).
traces="${KVRM_TRACES_DIR:-../shared/traces}"
"$bin/tools/replay/kvrm_replay" --server="127.0.0.1:$port" \
  --trace="$traces/azure-conv-2023/AzureLLMInferenceTrace_conv.csv" --duration="$seconds" \
  --time_scale=1 --input_scale=0.1 --output_scale=0.25 --json="$work/summary.json" \
  >"$work/replay.txt" 2>"$work/replay.err" &
replay=$!
sleep "$(( seconds < 240 ? seconds / 2 : 120 ))"
rss_early="$(rss)"
wait $replay
sleep 1
rss_end="$(rss)"
"$bin/tools/cli/kvrm_cli" info --server="127.0.0.1:$port" --json >"$work/info.json"

python3 - "$work" "$rss_early" "$rss_end" <<'PY'
import json, sys
work, early, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(f"{work}/summary.json"))
s = s.get("summary", s)
info = json.load(open(f"{work}/info.json"))["server"]
kv = info["kv"]
checks = {
    "requests replayed": s["requests"] > 0,
    "none failed": s["failed"] == 0,
    "all slots free": int(info.get("slotsInUse", info.get("slots_in_use", 0))) == 0,
    "queue empty": int(info.get("queueDepth", info.get("queue_depth", 0))) == 0,
    "all blocks free": int(kv.get("blocksFree", kv.get("blocks_free", 0))) == int(kv.get("blocksTotal", kv.get("blocks_total", -1))),
    "host tier empty": int(kv.get("hostBlocksUsed", kv.get("host_blocks_used", 0))) == 0,
    "RSS flat (<10% growth)": end <= early * 1.10,
}
print(f"soak: {s['requests']} requests, {s['completed']} completed, {s['refused']} refused, "
      f"{s['failed']} failed; RSS {early} kB -> {end} kB")
for k, v in checks.items():
    print(f"  {'ok  ' if v else 'FAIL'} {k}")
sys.exit(0 if all(checks.values()) else 1)
PY
