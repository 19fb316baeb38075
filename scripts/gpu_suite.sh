#!/usr/bin/env bash
# The one script to run on an H200 (or any sm_90 GPU): builds the CUDA targets if needed, runs every
# GPU test (ctest -L gpu, or the test binaries of a prebuilt folder), compute-sanitizer memcheck on
# the tiny-model forward, the kernel benchmarks, and the end-to-end forward benchmark on synthetic
# full-size checkpoints. Everything is logged under the output folder. See docs/gpu.md.
#
#   scripts/gpu_suite.sh [--build DIR] [--bin DIR] [--out DIR] [--models "20b 120b"] [--model-dir DIR]
#                        [--skip-tests] [--skip-benches] [--skip-sanitizer] [--quick]
#
#   --build DIR   build folder (default build-gpu); configured and built with ninja when --bin is absent
#   --bin DIR     a folder of prebuilt binaries (test_*, bench_*, bench_forward) to run instead of building
#   --out DIR     where logs go (default gpu-logs/<UTC date-time>)
#   --models L    synthetic presets for bench_forward, in order (default "20b"; "" for none). A preset is
#                 tried only if the previous one succeeded; its checkpoint is deleted after its run
#                 (64 GB disks: 20b takes 13 GB, 120b 61 GB).
#   --model-dir   where the synthetic checkpoints are written (default /tmp/osprey-models)
#   --quick       leave out test_moe_mlp's and test_moe_matrix's slowest cases (120b at 2048/8192 tokens and the 120b kernel variants
#                 other than the first: each checks ~35 s of CPU reference; the whole binary then takes > 5 min)
#
# Environment: OSPREY_SUITE_TIMEOUT (seconds per command, default 900), OSPREY_SUITE_SHARDS (--bin: test_moe_mlp
# and test_moe_matrix run as that many concurrent gtest shards, default 8), OSPREY_BENCH_FORWARD_ARGS (extra bench_forward flags), OSPREY_KERNEL_BENCH_ARGS (extra
# flags for every kernel benchmark, bench/kernel_bench.h: --filter, --iters, --hbm-gbps ...).
set -uo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
build="$here/build-gpu"
bin=""
out=""
models="20b"
model_dir="/tmp/osprey-models"
skip_tests=0 skip_benches=0 skip_sanitizer=0 quick=0
bench_forward_args="${OSPREY_BENCH_FORWARD_ARGS:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-benches) skip_benches=1; shift ;;
    --skip-sanitizer) skip_sanitizer=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_suite: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-$here/gpu-logs/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
failures=0

note() { echo "$*" | tee -a "$summary"; }
# The failed gtest cases named in a log, once each (at most 5).
failed_cases() {
  grep -E '^\[  FAILED  \] [^0-9]' "$1" | sed 's/^\[  FAILED  \] //; s/ (.*//' | sort -u | head -5 | tr '\n' ' '
}
# report NAME RC T0 [DETAIL]: notes PASS or FAIL (rc, "timed out" for 124, the failed gtest cases of
# $out/NAME.log) with DETAIL and the time since T0, counts the failure, and returns RC.
report() {
  local name="$1" rc="$2" t0="$3" detail="${4:-}"
  if [[ $rc -eq 0 ]]; then
    note "PASS $name (${detail}$((SECONDS - t0)) s)"
  else
    note "FAIL $name (rc $rc$([[ $rc -eq 124 ]] && echo ', timed out'), ${detail}$((SECONDS - t0)) s): see $name.log $(failed_cases "$out/$name.log")"
    failures=$((failures + 1))
  fi
  return "$rc"
}
# run NAME CMD...: runs CMD with its output in $out/NAME.log, notes PASS/FAIL and the time taken.
# Each command is cut off after $OSPREY_SUITE_TIMEOUT seconds (default 900; rc 124 then), so that one slow
# binary cannot take a whole lent-device call; a gtest binary's summary notes its failed cases.
run() {
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${OSPREY_SUITE_TIMEOUT:-900}" "$@" > "$out/$name.log" 2>&1
  report "$name" $? "$t0"
}

# run_sharded NAME N CMD...: a gtest binary as N concurrent shards (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX),
# each under the same time limit, logs concatenated into $out/NAME.log. test_moe_mlp's and test_moe_matrix's
# time is their CPU references, so shards on the H200 host's 16 cores take the whole table inside one lent-
# device call (test_moe_mlp: 534 cases in 158 s with 12 shards, 2026-12-02, against > 10 min in one process).
run_sharded() {
  local name="$1" n="$2"; shift 2
  local t0=$SECONDS i rc=0 pids=()
  for ((i = 0; i < n; i++)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "${OSPREY_SUITE_TIMEOUT:-900}" "$@" > "$out/$name.shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    local r=$?
    [[ $r -ne 0 && $rc -eq 0 ]] && rc=$r
  done
  cat "$out/$name".shard*.log > "$out/$name.log"
  rm -f "$out/$name".shard*.log
  report "$name" "$rc" "$t0" "$(grep -c '^\[       OK \]' "$out/$name.log") cases passed in $n shards, "
}

note "gpu_suite: $(date -u) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$summary"

if [[ -z "$bin" ]]; then
  if [[ ! -f "$build/build.ninja" ]]; then
    run configure cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release || exit 1
  fi
  run build ninja -C "$build" || exit 1
  bin_of() { find "$build" -type f -name "$1" -perm -u+x | head -1; }
else
  bin_of() { [[ -x "$bin/$1" ]] && echo "$bin/$1"; }
  export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libraries staged beside the binaries (CUPTI)
fi

if [[ $skip_tests -eq 0 ]]; then
  if [[ -z "$bin" ]]; then
    if [[ $quick -eq 1 ]]; then
      run ctest_gpu ctest --test-dir "$build" -L gpu -E 'Moe(Mlp|Matrix)Table.*120b_(8192|2048|.*_v)' --output-on-failure
    else
      run ctest_gpu ctest --test-dir "$build" -L gpu --output-on-failure
    fi
  else
    for t in "$bin"/test_*; do
      [[ -x "$t" ]] || continue
      big=0
      [[ "$(basename "$t")" == test_moe_mlp || "$(basename "$t")" == test_moe_matrix ]] && big=1
      if [[ $quick -eq 1 && $big -eq 1 ]]; then
        run_sharded "$(basename "$t")" "${OSPREY_SUITE_SHARDS:-8}" "$t" --gtest_filter='-*120b_8192*:*120b_2048*:*120b_*_v*'
      elif [[ $big -eq 1 ]]; then
        run_sharded "$(basename "$t")" "${OSPREY_SUITE_SHARDS:-8}" "$t"
      else
        run "$(basename "$t")" "$t"
      fi
    done
  fi
  # Opt-in decode variants through the whole forward (test_cuda_forward: the tiny model's GPU greedy
  # tokens against the CPU reference, graphs included): the out-projection and router in one grid.
  fwd="$(bin_of test_cuda_forward)"
  [[ -n "$fwd" ]] && run test_cuda_forward_router_tail env OSPREY_ROUTER_TAIL=1 "$fwd"
  if [[ $skip_sanitizer -eq 0 ]]; then
    gemv_test="$(bin_of test_gemv)"
    if [[ -n "$gemv_test" ]] && command -v compute-sanitizer > /dev/null; then
      run memcheck_router_tail compute-sanitizer --tool memcheck --error-exitcode 1 "$gemv_test" \
        --gtest_filter='cuda_gemv.router_tail*'
    fi
    fwd="$(bin_of test_cuda_forward)"
    if [[ -n "$fwd" ]] && command -v compute-sanitizer > /dev/null; then
      run memcheck_forward compute-sanitizer --tool memcheck --error-exitcode 1 "$fwd" \
        --gtest_filter='cuda_forward.mixed_ragged_batch:cuda_forward.graph_decode_matches_eager'
    else
      note "SKIP memcheck_forward (no test_cuda_forward or compute-sanitizer)"
    fi
  fi
fi

if [[ $skip_benches -eq 0 ]]; then
  # The kernel benchmarks run the case tables of tests/kernels/cases/ in perf mode (docs/gpu.md);
  # OSPREY_KERNEL_BENCH_ARGS (e.g. "--iters 20") is passed to each, and each writes its figures as JSON.
  # shellcheck disable=SC2086
  for b in bench_linear bench_attention bench_moe bench_sampling bench_rmsnorm bench_rope; do
    exe="$(bin_of $b)"
    if [[ -n "$exe" ]]; then
      run "$b" "$exe" --json "$out/$b.json" ${OSPREY_KERNEL_BENCH_ARGS:-}
    else
      note "SKIP $b (not built)"
    fi
  done
  fwd_bench="$(bin_of bench_forward)"
  for preset in $models; do
    [[ -n "$fwd_bench" ]] || { note "SKIP bench_forward (not built)"; break; }
    dir="$model_dir/$preset"
    rm -rf "$dir"
    # shellcheck disable=SC2086
    run "bench_forward_$preset" "$fwd_bench" --model "$dir" --make-preset "$preset" $bench_forward_args
    rc=$?
    rm -rf "$dir"
    [[ $rc -eq 0 ]] || break
  done
fi

note "gpu_suite: $failures failure(s); logs in $out"
[[ $failures -eq 0 ]]
