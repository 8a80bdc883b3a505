#!/usr/bin/env bash
# Runs the embedding bench on the tiny model (two prompt lengths, two pairs of runs so that the
# order alternates) and checks its JSON: both rows, both modes with every run, positive rates and
# ratios, the roofline fields.
set -euo pipefail
out="${TEST_TMPDIR}/embedding.json"
bench/embedding_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --prompt_tokens=16,64 \
  --requests=6 --slots=2 --repeats=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "requests", "slots", "repeats",
            "peak_instruction", "peak_gflops"):
    assert key in d, key
assert d["model"] == "tiny" and d["requests"] == 6 and d["repeats"] == 2, d
assert [r["prompt_tokens"] for r in d["rows"]] == [16, 64], d["rows"]
for r in d["rows"]:
    for mode in ("embed", "generate_1"):
        m = r[mode]
        assert len(m["runs"]) == 2, r
        assert m["wall_s"] > 0 and m["tokens_per_s"] > 0, r
    assert r["embed"]["tokens"] == 0, r           # embeddings generate nothing
    assert r["generate_1"]["tokens"] == 6, r      # one token per prompt
    assert r["ratio_tokens_per_s"] > 0 and len(r["ratio_runs"]) == 2, r
    assert r["embed_gflops"] > 0 and r["generate_1_gflops"] > 0, r
    assert r["embed_of_peak"] >= 0, r
print("ok")
PY
