#!/usr/bin/env bash
# Runs the speculative-decoding bench on the tiny model (both workloads, two concurrencies, two
# pairs of runs so that the order alternates) and checks its JSON: every row, outputs identical
# with drafts and without, every request's tokens counted, no drafts without speculation, the
# draft counters consistent with each other and with the tokens per step, positive times.
set -euo pipefail
out="${TEST_TMPDIR}/speculative.json"
bench/speculative_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --concurrency=1,4 \
  --workloads=repeat,sampled --prompt_tokens=64 --max_new_tokens=40 --repeats=2 \
  --speculative_tokens=4 --json="$out"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "prompt_tokens", "max_new_tokens",
            "speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "repeats",
            "temperature", "max_prefill_stall"):
    assert key in d, key
assert d["model"] == "tiny" and d["speculative_tokens"] == 4 and d["repeats"] == 2, d
assert d["all_identical"] is True, d
rows = d["rows"]
got = [(r["workload"], r["concurrency"], r["requests"]) for r in rows]
assert got == [(w, c, 2 * c) for w in ("repeat", "sampled") for c in (1, 4)], got
k = d["speculative_tokens"]
for r in rows:
    assert r["identical"] is True, r
    off, on = r["without"], r["with"]
    for m in (off, on):
        assert m["tokens"] == r["requests"] * d["max_new_tokens"], r
        assert len(m["runs"]) == 2, r
        assert m["wall_s"] > 0 and m["tokens_per_s"] > 0 and m["tpot_ms"] > 0, r
        assert 0 < m["ttft_s"] < m["wall_s"], r
        assert 0 <= m["mixed_steps"] <= m["steps"], r
        assert 0 < m["cpu_share"] and m["others_cores_max"] >= 0, r
        for run in m["runs"]:
            assert run["accepted_tokens"] <= run["draft_tokens"] <= k * run["drafts"], run
            assert run["drafts"] <= run["draft_tokens"], run
    assert off["draft_tokens"] == 0 and off["accepted_tokens"] == 0 and off["drafts"] == 0, r
    assert off["tokens_per_step"] == 1 and off["acceptance"] == 0, r
    assert 0 <= on["acceptance"] <= 1, r
    assert 1 <= on["tokens_per_step"] <= k + 1, r
    assert r["speedup_tokens_per_s"] > 0 and r["speedup_tpot"] > 0, r
    assert len(r["speedup_tokens_per_s_runs"]) == 2, r
    # The proposer replayed over the outputs, drafting wherever it matches: at least the drafts
    # the engine's policy chose to verify, and the same token-by-token acceptance rule.
    lk = r["lookup_replay"]
    assert lk["accepted_tokens"] <= lk["draft_tokens"] <= k * lk["drafts"], lk
    assert lk["drafts"] <= lk["steps"], lk
    assert 1 <= lk["tokens_per_step"] <= k + 1, lk
# Greedy decoding of prompts that repeat themselves: drafts are proposed and some accepted.
repeat = [r["with"] for r in rows if r["workload"] == "repeat"]
assert sum(m["accepted_tokens"] for m in repeat) > 0, repeat
print("ok")
PY

# A structured output whose keys and punctuation are forced: jump-forward drafts are accepted,
# the outputs identical, fewer steps with drafts than without.
rec="${TEST_TMPDIR}/record.json"
bench/speculative_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --concurrency=1 \
  --workloads=record --prompt_tokens=32 --max_new_tokens=40 --repeats=1 --json="$rec"
python3 - "$rec" <<'PY'
import json, sys
(row,) = json.load(open(sys.argv[1]))["rows"]
assert row["workload"] == "record" and row["identical"], row
w, o = row["with"], row["without"]
assert w["accepted_tokens"] > 0 and w["steps"] < o["steps"], row
print("ok")
PY
