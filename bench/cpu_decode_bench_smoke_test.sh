#!/bin/bash
# Runs the decode benchmark on the tiny model with minimal settings (both tensor-parallel
# modes) and checks that it prints its tables and writes its JSON.
set -euo pipefail
bench=bench/cpu_decode_bench
for tp in 1 2; do
  json="${TEST_TMPDIR}/bench_tp${tp}.json"
  out=$("${bench}" --size=tiny --dtypes=bf16 --slots=1,3 --contexts=16 --prompts=20 --chunk=8 \
    --mixed_chunks=4 --steps=2 --stream_mb=16 --tp=${tp} --json="${json}")
  echo "${out}"
  grep -q "^decode (tiny model)" <<<"${out}"
  grep -q "^prefill (chunks of 8)" <<<"${out}"
  grep -q '"roofline_tokens_per_s"' "${json}"
  grep -q '"prompt_tokens": 20' "${json}"
  grep -q "^mixed steps" <<<"${out}"
  grep -q '"one_pass_ms"' "${json}"
  grep -q "\"tensor_parallel\": ${tp}" "${json}"
done
echo PASS
