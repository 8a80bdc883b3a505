#!/usr/bin/env bash
# Runs the rerank bench on the tiny model (two document lengths, two pairs of calls so that the
# order alternates) and checks its JSON: both rows, every call timed, positive rates and ratios,
# and the pairs' tokens counted (the bench itself fails when Score and Embed prefill different
# token counts).
set -euo pipefail
out="${TEST_TMPDIR}/rerank.json"
bench/rerank_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --document_tokens=16,48 \
  --documents=6 --slots=2 --repeats=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "documents", "query_tokens", "slots",
            "repeats", "head"):
    assert key in d, key
assert d["model"] == "tiny" and d["documents"] == 6 and d["repeats"] == 2, d
assert d["head"].startswith("LM head rows"), d["head"]
assert [r["document_tokens"] for r in d["rows"]] == [16, 48], d["rows"]
for r in d["rows"]:
    assert len(r["score_wall_s"]) == 2 and len(r["embed_wall_s"]) == 2, r
    assert all(s > 0 for s in r["score_wall_s"] + r["embed_wall_s"]), r
    # Six pairs of a 16-token query (decoded text, re-encoded: about 16) and the document.
    assert r["pair_tokens"] > 6 * r["document_tokens"] // 2, r
    assert r["score_documents_per_s"] > 0 and r["embed_documents_per_s"] > 0, r
    assert r["ratio_documents_per_s"] > 0 and len(r["ratio_runs"]) == 2, r
print("ok")
PY
