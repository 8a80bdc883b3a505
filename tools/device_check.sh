#!/usr/bin/env bash
# The GPU check of the CUDA backend (runtime/cuda/device_check.cc), in two halves because the
# lent GPU machine has no Bazel and none of the project's system libraries:
#
#   tools/device_check.sh prepare   # here: builds the check and packs it with the Abseil
#                                   # (and libstdc++) libraries it needs into .device/pack.tar.gz
#                                   # (compressed: the carry, with the working tree, must stay
#                                   # under 64 MiB; ICU's data library alone is 30 MiB)
#   tools/device_check.sh run       # on the GPU machine: finds the CUDA, cuBLASLt and NCCL
#                                   # libraries there, runs the check, writes its log and JSON
#                                   # to $OUT (or ./device-check-out), prints the table last;
#                                   # then the claims in process on the GPU (bench/engine_claims:
#                                   # static vs kvrm through the real engine, every request
#                                   # queued at once), its table and JSON beside
#
# Through the device tool, with the prepared folder carried:
#   run(command="tools/device_check.sh run --quick", carry=[".device"], timeout_s=540)
# On one H200 (2026-12-04) `run --quick` took 44 s and `run` about 2 minutes: kernel checks,
# backend vs CPU with f32 and bf16 KV pools, decode at 16, 64 and 128 slots (context 512), at 64
# slots with contexts 2048 and 4000, and with a bf16 pool; `run --quick` benchmarks 64 slots only
# and runs the engine claims on 50 requests a family (200 without it). Since then the checks also
# run the Qwen2/Qwen3 attention kernels and modelgen's tiny-qwen2 / tiny-qwen3 models (generated
# into $TMPDIR) against the CPU backend: a few seconds more by estimate, not yet timed on a GPU.
#
#   tools/device_check.sh profile [--slots=a,b --contexts=a,b --split_tokens=a,b
#                                  --token_sets=2,4 --kv=f32,bf16]
#                                   # on the GPU machine: the checks, a sweep of those lists, and
#                                   # ncu's per-kernel times of one 64-slot step (docs/perf)
# Bounds: the check 210 s, the claims 80 s with --quick (240 s without), so `run --quick` ends
# within 5 minutes. Exit status: the check's (4: it ran past 210 s), else the claims' (3: they
# ran past their bound).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

setup_libraries() {
  [[ -f .device/pack.tar.gz ]] || { echo "no .device/pack.tar.gz: run 'tools/device_check.sh prepare' here first" >&2; exit 1; }
  out=${OUT:-$PWD/device-check-out}
  mkdir -p "$out"
  pack=${TMPDIR:-/tmp}/kvrm-device
  rm -rf "$pack" && mkdir -p "$pack" && tar -C "$pack" -xzf .device/pack.tar.gz
  libpath=$pack/lib
  # The CUDA runtime and cuBLASLt from one installation (a toolkit's cuBLASLt with a wheel's
  # runtime, or the reverse, may not load): the toolkit's when it has both, else what
  # ldconfig knows, else the pip wheels' (nvidia-*-cu13). NCCL apart: the toolkit rarely has it.
  find_lib() {
    local name=$1 found
    # awk reads to the end (no `exit`): ldconfig must not die of SIGPIPE under pipefail.
    found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && !f {print $NF; f = 1}')
    if [[ -z "$found" ]]; then
      found=$(find /usr/local /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || echo /nonexistent)" \
                -name "$name" 2>/dev/null | head -1 || true)
    fi
    if [[ -z "$found" ]]; then echo "device_check: $name not found on this machine" >&2; return 1; fi
    dirname "$found"
  }
  cuda_dir=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [[ -e $d/libcudart.so.13 && -e $d/libcublasLt.so.13 ]]; then cuda_dir=$d; break; fi
  done
  if [[ -n "$cuda_dir" ]]; then
    libpath=$libpath:$cuda_dir
  else
    for name in libcudart.so.13 libcublasLt.so.13; do libpath=$libpath:$(find_lib "$name"); done
  fi
  if [[ -n "$cuda_dir" && -e $cuda_dir/libnccl.so.2 ]]; then
    :
  else
    libpath=$libpath:$(find_lib libnccl.so.2)
  fi
  echo "device_check: libraries from ${libpath#"$pack/lib:"}"
  sys_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && !f {print $NF; f = 1}')
  if ! grep -q GLIBCXX_3.4.30 "$sys_cxx" 2>/dev/null; then libpath=$libpath:$pack/libstdcxx; fi
}

case "$mode" in
  prepare)
    bazel build -c opt //runtime/cuda:device_check //bench:engine_claims
    bindir=$(bazel info -c opt bazel-bin 2>/dev/null)
    stage=$(mktemp -d)
    mkdir -p "$stage/lib" "$stage/libstdcxx"
    for bin in "$bindir/runtime/cuda/device_check" "$bindir/bench/engine_claims"; do
      cp "$bin" "$stage/"
      chmod u+w "$stage/$(basename "$bin")"
      # Everything the binaries link that is neither the C library nor CUDA's: Abseil, and the
      # tokenizer's Oniguruma and ICU (Debian's shared objects); libstdc++/libgcc apart, used
      # only where the machine's are older.
      ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
          libabsl_*|libonig.so.*|libicu*) cp -L "$lib" "$stage/lib/" ;;
          libstdc++.so.6|libgcc_s.so.1) cp -L "$lib" "$stage/libstdcxx/" ;;
        esac
      done
    done
    rm -rf .device && mkdir -p .device
    tar -C "$stage" -czf .device/pack.tar.gz .
    rm -rf "$stage"
    grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    du -sh .device
    echo "prepared .device/: carry it to the GPU machine and run: tools/device_check.sh run"
    ;;
  run)
    setup_libraries
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.txt" || true
    set -o pipefail
    status=0
    # Bounded, so that the whole run stays under 5 minutes (two runs fit one lent machine).
    LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 210 "$pack/device_check" --json "$out/device_check.json" "$@" 2>&1 \
      | tee "$out/device_check.log" || status=$?
    if [[ $status -eq 124 ]]; then
      echo "device_check: the check ran past its 210 s" >&2
      status=4
    fi
    # The claims through the engine on the GPU: the paper_claims families at full length (with
    # --quick, 50 requests a family, so that the whole run stays well inside one device call).
    quick=0
    for a in "$@"; do [[ $a == --quick ]] && quick=1; done
    claims_requests=200
    claims_limit=240
    if [[ $quick -eq 1 ]]; then
      claims_requests=50
      claims_limit=80
    fi
    if [[ -x "$pack/engine_claims" ]]; then
      # The generated model stays out of $OUT (hundreds of MB that would not come back).
      claims_status=0
      LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        timeout $claims_limit "$pack/engine_claims" --device=cuda --families=short,mixed \
          --requests=$claims_requests --model_dir="$pack/models" \
          --json "$out/engine_claims.json" 2>&1 \
          | grep -v '^W' | tee "$out/engine_claims.log" || claims_status=$?
      # Not 124: the device tool would read that as the whole command timing out.
      if [[ $claims_status -eq 124 ]]; then
        echo "device_check: engine_claims ran past its $claims_limit s" >&2
        claims_status=3
      fi
      [[ $status -eq 0 ]] && status=$claims_status
    fi
    exit $status
    ;;
  profile)
    # Where the decode step's time goes (on the GPU machine): the correctness checks, a sweep
    # (arguments: --slots, --contexts, --split_tokens, --kv lists), then ncu over two replays of
    # a 64-slot, context-512 graph, each kernel apart (time, DRAM traffic, occupancy).
    setup_libraries
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.txt" || true
    # The correctness checks first: a sweep of wrong kernels would measure nothing.
    LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 120 "$pack/device_check" --checks_only --json "$out/checks.json" 2>&1 \
      | grep -v '^I' | tee "$out/checks.log" || true
    LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 200 "$pack/device_check" --bench_only --json "$out/sweep.json" "$@" 2>&1 \
      | grep -v '^I' | tee "$out/sweep.log" || true
    ncu=$(command -v ncu || find /usr/local /opt -name ncu -type f 2>/dev/null | head -1 || true)
    if [[ -z "$ncu" ]]; then echo "device_check: no ncu here" >&2; exit 1; fi
    LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 200 "$ncu" --clock-control none --profile-from-start off --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread \
        "$pack/device_check" --bench_only --profile --slots=64 --contexts=512 \
        > "$out/ncu.csv" 2> "$out/ncu.err" || { echo "ncu failed"; tail -20 "$out/ncu.err"; }
    wc -l "$out/ncu.csv"
    ;;
  *)
    echo "usage: tools/device_check.sh prepare|run [--quick]|profile [sweep flags]" >&2
    exit 2
    ;;
esac
