#!/usr/bin/env bash
# Runs //bench:http_api_bench briefly against kvrmd on the tiny model and checks what it reports:
# every request through both APIs succeeds and every figure is filled in. The ratios themselves
# are recorded in docs/benchmarks.md from full runs.
set -euo pipefail
out="${TEST_TMPDIR}/http_api.json"
bench/http_api_bench --kvrmd=server/kvrmd --model=builtin:tiny --model_cache="${TEST_TMPDIR}/models" \
  --concurrency=1,4 --requests=4 --rounds=1 --max_tokens=12 --slots=4 --threads=2 --json="$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rs = r["results"]
assert [x["concurrency"] for x in rs] == [1, 4], rs
for x in rs:
    for api in ("grpc", "http"):
        f = x[api]
        assert f["requests"] == 4 and f["failed"] == 0, (api, f)
        assert f["ttft_p50_ms"] > 0 and f["itl_mean_ms"] > 0 and f["tokens_per_s"] > 0, (api, f)
    assert x["http_over_grpc"]["tokens_per_s"] > 0, x
print("ok", [(x["concurrency"], round(x["http_over_grpc"]["tokens_per_s"], 3)) for x in rs])
PY
