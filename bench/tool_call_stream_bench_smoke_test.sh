#!/usr/bin/env bash
# Runs //bench:tool_call_stream_bench on a 16 KB call and checks what it reports: every format's
# stream gives the one call with its content whole, as one read of the reply does, and no stream
# costs more than 100 reads of the whole reply (a stream that re-read the reply at each of its
# ~4,000 pieces would cost ~2,000; the figures themselves are in docs/benchmarks.md).
set -euo pipefail
out="${TEST_TMPDIR}/tool_call_stream.json"
bench/tool_call_stream_bench --kb=16 --piece=4 --repeats=3 --json="$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fs = r["formats"]
assert len(fs) == 12, [f["format"] for f in fs]
for f in fs:
    assert f["calls_right"], f
    assert f["pieces"] > 4000, f
    assert f["stream_over_one_read"] < 100, f
print("ok", [(f["format"], round(f["stream_over_one_read"], 1)) for f in fs])
PY
