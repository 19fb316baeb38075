#!/usr/bin/env bash
# Issue 16's H200 sweep (docs/performance.md, "Speculative decoding on the H200"): on synthetic gpt-oss
# checkpoints (random weights, so acceptance is forced by the bench's test modes),
#   sweep_<preset>   osprey bench decode --speculative ngram at batch 1, 8, 64, context 1024, k = 4:
#                    no speculation, forced L = 0..4 (mean accepted length 1..5) and forced fractions
#                    F = 0.5, 0.8 (each proposal accepted with probability F: mean length ~1.9, ~3.4);
#                    tokens/s against mean accepted length
#   ngram_<preset>   n-gram lookup on its own (every proposal refused on random weights) at batch 1 and
#                    64, after a long warm-up: the no-acceptance cost with the adaptive policy (target
#                    <= 3%), then the same with --spec-adaptive 0 (a proposal on every step) for contrast
# for the 20b and then the 120b preset. Every command's output goes to OUT/<step>.log and its JSON and
# markdown report to OUT/<step>.{json,md}; OUT/summary.txt lists PASS/FAIL, seconds per step and every
# result line. A failed step does not stop the later ones (the script exits non-zero at the end).
#
#   scripts/bench_speculative.sh [--osprey EXE] [--out DIR] [--models "20b 120b"] [--model-dir DIR]
#                                [--context 1024] [--steps 128] [--warmup 64] [--quick]
#
#   --osprey EXE     the osprey executable (default: .device/cuda/bin/osprey when present, as
#                    scripts/stage_gpu_bin.sh leaves it, else build/osprey)
#   --out DIR        output folder (default $OUT when set, else gpu-logs/spec-<UTC date-time>)
#   --models LIST    presets to run, in order (default "20b 120b")
#   --model-dir DIR  where checkpoints live (default /dev/shm): DIR/m20, DIR/m120, reused when their
#                    config.json exists, else written with `osprey make-model --preset P --seed 1`
#                    (120b: ~45 s, 61 GB). A checkpoint this script wrote is deleted before the next
#                    preset's is written (the H200 machine's /dev/shm holds one 120b), unless
#                    KEEP_MODELS=1.
#   --context N      prompt length of every sequence (default 1024)
#   --steps, --warmup  timed and warm-up engine steps of the sweep (default 128, 64); the n-gram runs
#                    take twice as many of each (the back-off's and the policy's long-run cost)
#   --quick          --steps 64 --warmup 32
#
# Budget: about 6-7 minutes of H200 wall time for both presets (120b's write and its batch-64
# verifies dominate); each bench command is killed after RUN_TIMEOUT seconds (default 300).
# Smoke-testing elsewhere: BACKEND=cpu BATCHES=1,2 NGRAM_BATCHES=1,2 scripts/bench_speculative.sh
# --models tiny --model-dir /tmp --context 64 --steps 8 --warmup 4 (the tiny preset goes to /tmp/mtiny).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
osprey=""
out="${OUT:-}"
models="20b 120b"
model_dir="/dev/shm"
context=1024
steps=128
warmup=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --osprey) osprey="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --context) context="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --quick) steps=64; warmup=32; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0"; exit 0 ;;
    *) echo "bench_speculative: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ngram_steps=$((2 * steps))
ngram_warmup=$((2 * warmup))
if [[ -z "$osprey" ]]; then
  osprey="$here/build/osprey"
  [[ -x "$here/.device/cuda/bin/osprey" ]] && osprey="$here/.device/cuda/bin/osprey"
fi
out="${out:-$here/gpu-logs/spec-$(date -u +%Y%m%d-%H%M%S)}"
backend="${BACKEND:-cuda}"
batches="${BATCHES:-1,8,64}"
ngram_batches="${NGRAM_BATCHES:-1,64}"
run_timeout="${RUN_TIMEOUT:-300}"
mkdir -p "$out"
summary="$out/summary.txt"
touch "$summary"
failures=0

note() { echo "$*" | tee -a "$summary"; }
# run NAME CMD...: CMD's output goes to OUT/NAME.log (and the terminal); notes PASS/FAIL, seconds and
# the bench's result lines.
run() {
  local name="$1"; shift
  local t0=$SECONDS rc=0
  echo "+ $*" > "$out/$name.log"
  timeout "$run_timeout" "$@" 2>&1 | tee -a "$out/$name.log" || rc=$?
  grep -E '^context [0-9]+ batch ' "$out/$name.log" | sed "s/^/  $name: /" >> "$summary" || true
  if [[ $rc -eq 0 ]]; then
    note "PASS $name ($((SECONDS - t0)) s)"
  else
    note "FAIL $name (rc $rc, $((SECONDS - t0)) s): see $name.log"
    failures=$((failures + 1))
  fi
  return $rc
}

[[ -x "$osprey" ]] || { echo "bench_speculative: no osprey executable at $osprey (--osprey EXE)" >&2; exit 1; }
note "bench_speculative: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$summary" || true
note "$("$osprey" --version) (the commit every report records)"

written=""  # a checkpoint this script wrote, deleted before the next one is written
for preset in $models; do
  dir="$model_dir/m${preset%b}"  # m20, m120 (the names docs/performance.md uses)
  if [[ -f "$dir/config.json" ]]; then
    note "model $preset: reusing $dir"
  else
    if [[ -n "$written" && "${KEEP_MODELS:-0}" != 1 ]]; then
      rm -rf "$written"
      note "removed $written (room for the next checkpoint; KEEP_MODELS=1 keeps it)"
      written=""
    fi
    run "make_model_$preset" "$osprey" make-model --preset "$preset" --seed 1 --out "$dir" --threads "$(nproc)" || continue
    written="$dir"
  fi
  common=(--model "$dir" --backend "$backend" --contexts "$context" --speculative ngram --num-speculative-tokens 4)
  run "sweep_$preset" "$osprey" bench decode "${common[@]}" --batches "$batches" \
    --forced-accept-len 0,1,2,3,4 --forced-accept-fraction 0.5,0.8 --steps "$steps" --warmup "$warmup" \
    --out "$out/sweep-$preset" || true
  run "ngram_$preset" "$osprey" bench decode "${common[@]}" --batches "$ngram_batches" \
    --steps "$ngram_steps" --warmup "$ngram_warmup" --out "$out/ngram-$preset" || true
  run "ngram_every_step_$preset" "$osprey" bench decode "${common[@]}" --batches "$ngram_batches" --spec-adaptive 0 \
    --steps "$ngram_steps" --warmup "$ngram_warmup" --out "$out/ngram-every-step-$preset" || true
done

note "bench_speculative: $failures failure(s); results in $out"
[[ $failures -eq 0 ]]
