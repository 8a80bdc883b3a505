#!/usr/bin/env bash
# Runs the prefix-match bench on the tiny model (two block sizes, two pairs of runs so that the
# order alternates) and checks its JSON: both rows, both modes with every run, positive figures,
# the same tokens in both modes, and fewer prompt tokens prefilled to the token than by whole
# blocks (every retry prefills one token; whole blocks leave up to a block's worth).
set -euo pipefail
out="${TEST_TMPDIR}/prefix-match.json"
bench/prefix_match_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --block_tokens=8,32 \
  --requests=6 --min_prompt=20 --max_prompt=90 --tokens=4 --turn_tokens=6 --slots=4 \
  --prefill_chunk=64 --repeats=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "requests", "tokens", "turn_tokens",
            "slots", "prefill_chunk", "repeats", "same_tokens"):
    assert key in d, key
assert d["model"] == "tiny" and d["requests"] == 6 and d["repeats"] == 2, d
assert d["same_tokens"] is True, d
assert [r["block_tokens"] for r in d["rows"]] == [8, 32], d["rows"]
for r in d["rows"]:
    for mode in ("whole_blocks", "to_the_token"):
        m = r[mode]
        assert len(m["runs"]) == 2, r
        assert m["wall_s"] > 0 and m["tokens_per_s"] > 0 and m["ttft_s"] > 0, r
        assert m["tokens"] == 12 * 4, r
        assert m["cached_tokens"] + m["prefilled_tokens"] == r["prompt_tokens"], r
    w, t = r["whole_blocks"], r["to_the_token"]
    assert w["copied_tokens"] == 0, r
    assert t["copied_tokens"] > 0, r
    # The 6 retries alone prefill one token each to the token.
    assert t["prefilled_tokens"] < w["prefilled_tokens"], r
    assert r["ratio_prefilled_whole_over_token"] > 1, r
    assert r["same_tokens"] is True, r
print("ok")
PY
