#!/usr/bin/env bash
# Runs the LoRA serving bench on the tiny model (its default modes and a second rank, two
# concurrencies, one run each) and checks its table and JSON: every row and mode, base requests' tokens the same
# in every mode, adapted requests' the same in every run and different from the base model's,
# every request's tokens counted, the FLOP expectations ordered as the ranks are; and --churn's
# loads while serving (some loads, identical tokens).
set -euo pipefail
out="${TEST_TMPDIR}/lora.json"
table="${TEST_TMPDIR}/lora.txt"
bench/lora_bench --size=tiny --model_dir="${TEST_TMPDIR}/models" --concurrency=1,2 \
  --prompt_tokens=32 --max_new_tokens=16 --repeats=1 --adapters=2 --rank=8 --ranks=4,8 --churn \
  --json="$out" | tee "$table"
grep -q '^| C | requests | mode | rank |' "$table"
grep -q '^## Loads while serving' "$table"
[[ "$(grep -c '^| [12] | ' "$table")" == 10 ]]
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("date", "cpu", "cores", "model", "threads", "prompt_tokens", "max_new_tokens", "rank",
            "num_adapters", "repeats", "max_prefill_stall", "base_macs_per_token", "adapters"):
    assert key in d, key
assert d["model"] == "tiny" and d["rank"] == 8 and d["repeats"] == 1, d
assert d["all_ok"] is True, d
# Two adapters of rank 8 and the rank-4 one of the sweep.
assert [a["rank"] for a in d["adapters"]] == [8, 8, 4], d["adapters"]
for a in d["adapters"]:
    assert len(a["target_modules"]) == 7 and 0 < a["flops_vs_base"] < 1, a
    assert a["macs_per_token_as_computed"] >= a["macs_per_token"], a
rows = d["rows"]
assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 2), (2, 4)], rows
for r in rows:
    assert r["ok"] and r["base_identical"] and r["adapter_identical"], r
    assert r["adapted_requests"] > 0 and r["adapted_same_as_base"] == 0, r
    modes = {m["mode"]: m for m in r["modes"]}
    assert list(modes) == ["base", "unloaded", "one-r4", "one", "mixed"], list(modes)
    n = r["requests"]
    assert [modes[k]["adapted_requests"] for k in modes] == [0, 0, n, n, n - (n + 2) // 3], r
    for m in modes.values():
        assert m["tokens"] == n * d["max_new_tokens"], m
        assert len(m["runs"]) == 1, m
        assert m["wall_s"] > 0 and m["tokens_per_s"] > 0 and m["tpot_ms"] > 0, m
        assert 0 < m["ttft_s"] < m["wall_s"], m
        assert m["tokens_per_s_vs_base"] > 0 and m["tpot_vs_base"] > 0, m
        assert m["flops_vs_base"] <= m["flops_vs_base_as_computed"], m
        assert m["run_macs_base"] > 0 and m["gmacs_per_s"] >= 0, m
        assert (m["run_macs_lora"] > 0) == (m["adapted_requests"] > 0), m
    assert modes["base"]["flops_vs_base"] == modes["unloaded"]["flops_vs_base"] == 1, r
    assert 1 < modes["one-r4"]["flops_vs_base"] < modes["one"]["flops_vs_base"], r
    assert 1 < modes["mixed"]["flops_vs_base"] < modes["one"]["flops_vs_base"], r
# Loads while serving: some loads, the same tokens as without them.
c = d["churn"]
assert c["concurrency"] == 1 and c["adapter_rank"] == 8 and c["outputs_identical"] is True, c
assert sum(c["loads_per_run"]) > 0 and c["load_ms_median"] > 0, c
assert c["tokens_per_s_vs_quiet"] > 0 and c["tpot_vs_quiet"] > 0, c
assert c["quiet"]["tokens"] == c["churn"]["tokens"] == c["requests"] * d["max_new_tokens"], c
print("ok")
PY
