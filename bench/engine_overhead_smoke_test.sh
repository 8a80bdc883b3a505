#!/usr/bin/env bash
# Runs the engine-overhead bench on the tiny model for a few steps and checks its JSON: every
# sampling path at every slot count, every slot decoding every timed step, positive times.
set -euo pipefail
out="${TEST_TMPDIR}/engine-overhead.json"
bench/engine_overhead --size=tiny --model_dir="${TEST_TMPDIR}/models" --slots=2,8 --prompt=40 \
  --steps=30 --warmup=5 --handoff_spin_us=0,500 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
got = [(r["sampling"], r["slots"], r["handoff_spin_us"]) for r in rows]
want = [(p, s, u) for p in ("device-greedy", "host-greedy", "host-top-p") for s in (2, 8)
        for u in (0, 500)]
assert got == want, got
for r in rows:
    assert r["tokens"] == 30 * r["slots"], r
    assert r["engine_us_per_step"] > 0 and r["engine_us_per_token"] > 0, r
    # The device path fills no logits rows.
    if r["sampling"] == "device-greedy":
        assert r["null_backend_us_per_step"] < 50, r
print("ok")
PY
