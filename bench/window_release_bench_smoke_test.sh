#!/usr/bin/env bash
# Runs the window-release bench on the tiny sliding-window model (a 48-position window; 4 slots
# of 64 prompt + 96 generated tokens, two rounds) and checks its JSON: the three modes, outputs
# identical in every run, every request's tokens counted, release's pool the working set a slot
# with nothing preempted and blocks released, keeping on that pool pausing requests, keeping
# every block needing the larger pool at its peak.
set -euo pipefail
out="${TEST_TMPDIR}/window_release.json"
bench/window_release_bench --size=tiny-mistral-sw --model_dir="${TEST_TMPDIR}/models" --slots=4 \
  --requests=4 --prompt_tokens=64 --max_new_tokens=96 --prefill_chunk=32 --repeats=2 \
  --between=4 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "sliding_window", "slots", "requests",
            "prompt_tokens", "max_new_tokens", "block_tokens", "window_peak_blocks", "repeats"):
    assert key in d, key
assert d["model"] == "tiny-mistral-sw" and d["sliding_window"] == 48, d
# (47 + 31) // 16 + 2 blocks a slot: from the block behind the window to a chunk's last.
assert d["window_peak_blocks"] == 6, d
assert d["all_identical"] is True, d
release, same, full = d["rows"]
assert [r["mode"] for r in d["rows"]] == ["release", "keep, same pool", "keep, full pool"], d
for r in d["rows"]:
    assert r["identical"] is True, r
    assert r["tokens"] == d["requests"] * d["max_new_tokens"], r
    assert len(r["runs"]) == 2 and r["tokens_per_s"] > 0 and 0 < r["ttft_s"] < r["wall_s"], r
    assert 0 < r["peak_blocks"] <= r["kv_blocks"] and r["moved_blocks"] >= 0, r
assert release["window_release"] and not same["window_release"] and not full["window_release"]
assert release["kv_blocks"] == 4 * 6 == same["kv_blocks"] and full["kv_blocks"] == 4 * 10, d
assert release["preemptions"] == 0 and release["released_blocks"] > 0, release
assert same["released_blocks"] == 0 and full["released_blocks"] == 0, d
assert same["preemptions"] > 0 and same["moved_blocks"] > 0, same  # 4 histories of 10 on 24
assert full["peak_blocks"] > release["peak_blocks"], d
assert d["keep_full_pool_over_release_pool"] == 40 / 24, d
# Conversations: turn 2 (each 160-token history + 64 new tokens) after 4 other requests finds the
# whole written history under release (its last windows, 3 blocks each, from either tier), with
# the tokens of keeping every block; keeping needs every block of it, and 64 + 64 blocks do not
# hold the 40 of turn 1 beside the 96 of the requests between, so it finds at most as much.
c = d["conversation"]
assert c["turn2_tokens"] == 64 and c["between_requests"] == 4, c
rel, keep = c["rows"]
assert rel["mode"] == "release" and keep["mode"] == "keep, full pool", c
assert rel["identical"] and keep["identical"], c
assert rel["turn2_prompt_tokens"] == keep["turn2_prompt_tokens"] == 4 * (160 + 64), c
# 159 tokens of K/V written per history: 9 full blocks of 16.
assert rel["turn2_cached_tokens"] == 4 * 9 * 16 >= keep["turn2_cached_tokens"] > 0, c
assert 0 <= rel["turn2_host_tokens"] <= rel["turn2_cached_tokens"], c
assert rel["kv_blocks"] == 4 * 6 and keep["kv_blocks"] == 4 * 16, c
print("ok")
PY
