#!/usr/bin/env bash
# Runs the prefill-packing bench on the tiny model (two prompt lengths, two pairs of runs so that
# the order alternates) and checks its JSON: both rows, both modes with every run, positive
# figures, the same tokens in both modes, and fewer prefilling steps packed than one a step.
set -euo pipefail
out="${TEST_TMPDIR}/packing.json"
bench/prefill_packing_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --prompt_tokens=12,40 \
  --requests=6 --tokens=4 --slots=4 --prefill_chunk=64 --repeats=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "requests", "tokens", "slots",
            "prefill_chunk", "repeats", "same_tokens"):
    assert key in d, key
assert d["model"] == "tiny" and d["requests"] == 6 and d["repeats"] == 2, d
assert d["same_tokens"] is True, d
assert [r["prompt_tokens"] for r in d["rows"]] == [12, 40], d["rows"]
for r in d["rows"]:
    for mode in ("packed", "one_a_step"):
        m = r[mode]
        assert len(m["runs"]) == 2, r
        assert m["wall_s"] > 0 and m["tokens_per_s"] > 0 and m["ttft_s"] > 0, r
        assert m["tokens"] == 6 * 4, r
    # 6 prompts of 12 tokens fit one 64-token step's budget beside nothing: packed prefills them
    # in fewer steps than one a step (6), several prompts a step.
    assert r["packed"]["prefill_steps"] < r["one_a_step"]["prefill_steps"], r
    assert r["packed"]["chunks_per_prefill_step"] > 1, r
    assert r["ratio_ttft_one_over_packed"] > 0 and len(r["ratio_ttft_runs"]) == 2, r
    assert r["same_tokens"] is True, r
print("ok")
PY
