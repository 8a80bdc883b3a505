#!/bin/bash
# Runs the far-history quality measure on the tiny model with a short prompt and checks that it
# prints one row per window, and that a window covering the whole history agrees exactly.
set -euo pipefail
out=$(bench/far_history_quality --size=tiny --model_dir="${TEST_TMPDIR}" --prompt=200 --steps=16 \
  --sinks=16 --windows=32,64,512 --chunk=64 --block_tokens=16)
echo "${out}"
grep -q "^far-history quality: tiny model" <<<"${out}"
[[ $(grep -cE "^ +(32|64|512) " <<<"${out}") == 3 ]]
# sinks + window past the history: nothing summarized, identical to off.
grep -qE "^ +512 +0/.* 100.0% +0 +0 +0 +100.0% +none$" <<<"${out}"
echo PASS
