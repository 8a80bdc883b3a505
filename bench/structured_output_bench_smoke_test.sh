#!/usr/bin/env bash
# Runs //bench:structured_output_bench briefly on the real Llama 3 vocabulary and checks what it
# reports: every constraint compiles, its walks end (a complete match or the end token), and the
# figures are filled in. The costs themselves are recorded in docs/benchmarks.md from full runs.
set -euo pipefail
out="${TEST_TMPDIR}/structured.json"
bench/structured_output_bench --tokenizer=model/testdata/tokenizers/llama3/tokenizer.json \
  --walks=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["vocab"] == 128256, r["vocab"]
cs = r["constraints"]
assert len(cs) == 8, [c["constraint"] for c in cs]
for c in cs:
    assert c["states"] > 0 and c["distinct_masks"] > 0, c
    assert c["distinct_masks"] <= c["states"], c
    assert c["tokens"] > 0 and c["mask_us_per_token"] > 0 and c["greedy_sample_us_per_token"] > 0, c
print("ok", [(c["constraint"], c["states"], c["walks_finished"]) for c in cs])
PY
