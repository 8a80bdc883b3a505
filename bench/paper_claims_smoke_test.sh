#!/usr/bin/env bash
# Runs the claims harness briefly (tiny model, two synthetic families, a few requests each) and
# checks its JSON: both modes served every request of every workload, at the families' rates and
# at saturation (all queued at once), and each entry carries its throughput ratio. The figures
# themselves are recorded in docs/benchmarks.md from full runs.
set -euo pipefail
out="${TEST_TMPDIR}/claims.json"
bench/paper_claims --kvrmd=server/kvrmd --model=builtin:tiny \
  --model_cache="${TEST_TMPDIR}/models" --workloads=short,mixed --duration_s=2 --rate=4 \
  --input_scale=0.5 --output_scale=0.25 --json="$out" >"${TEST_TMPDIR}/claims.txt"
grep -q "workload at saturation" "${TEST_TMPDIR}/claims.txt"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is True, "the last write marks the file complete"
# The mode that runs first alternates from one workload to the next.
firsts = [e["kvrm_first"] for section in ("workloads", "saturation") for e in d[section]]
assert firsts == [False, True, False, True], firsts
for section in ("workloads", "saturation"):
    entries = d.get(section, [])
    names = sorted(e["workload"] for e in entries)
    assert names == ["mixed", "short"], (section, names)
    for e in entries:
        for mode in ("static", "kvrm"):
            s = e[mode]
            assert s["requests"] == 8 and s["completed"] == 8 and s["failed"] == 0, (section, e["workload"], mode, s)
            assert s["output_tokens_per_s"] > 0, (section, e["workload"], mode)
            # Sampled every 50 ms: a saturation run of the tiny model can end before one, and
            # kvrm's requests (reserving only what they use) between two samples at these rates.
            # Static mode sets its slots' share aside whatever runs.
            assert s["reserved_peak_bytes"] >= s["reserved_mean_bytes"] >= 0, (section, mode)
            if section == "workloads" and mode == "static":
                assert s["reserved_mean_bytes"] > 0, (section, e["workload"], mode)
        assert e["throughput_kvrm_over_static"] > 0
print("ok")
PY
# Written whole each time (a temporary renamed over it): none is left behind.
test ! -e "$out.tmp"
