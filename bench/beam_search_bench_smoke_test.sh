#!/usr/bin/env bash
# Runs the beam search bench on the tiny model (two widths, two rounds) and checks its JSON:
# both rows, positive rates and ratios, and the cached engine's scoring prompts found in its
# prefix cache (the bench itself fails when a call generates other than width x tokens).
set -euo pipefail
out="${TEST_TMPDIR}/beam.json"
bench/beam_search_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --widths=1,3 \
  --prompt_tokens=40 --tokens=6 --slots=2 --repeats=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "prompt_tokens", "tokens", "slots",
            "repeats"):
    assert key in d, key
assert d["model"] == "tiny" and d["tokens"] == 6 and d["repeats"] == 2, d
assert [r["width"] for r in d["rows"]] == [1, 3], d["rows"]
for r in d["rows"]:
    for k in ("beam_tokens_per_s", "beam_no_cache_tokens_per_s", "sampled_tokens_per_s",
              "beam_one_a_step_tokens_per_s", "cache_speedup", "packed_speedup",
              "beam_over_sampled"):
        assert r[k] > 0, (k, r)
    assert len(r["cache_speedup_runs"]) == 2 and len(r["packed_speedup_runs"]) == 2, r
    # Every step after the first re-reads the 40-token prompt's two full blocks from the cache.
    assert 0 < r["cached_share"] < 1, r
print("ok")
PY
