#!/usr/bin/env bash
# One call on a lent GPU (docs/gpu.md, "A device call"): unpacks .device/bin.tar.xz (scripts/device_pack.sh)
# and runs the named stages in order, each under its own time limit, logging everything under $OUT (the
# run tool's output folder; ./device-out when unset) and appending the lines that matter to
# $OUT/summary.txt, which it prints at the end. A failed stage is noted and the next one runs.
#
#   bash scripts/device_call.sh STAGE...
#
# Stages:
#   model20 / model120   the synthetic checkpoint (osprey make-model --preset 20b|120b --seed 1) in /dev/shm
#   suite                scripts/gpu_suite.sh --bin ... --skip-benches --quick --models "" (every GPU test,
#                        memcheck; ~265 s with 12 shards)
#   timeline             bench_forward_tl --timeline at batch 1 and 8 (needs device_pack.sh --timeline)
#   trace                bench_forward --trace at batch 1 (per-kernel shares of the busy time)
#   moe                  bench_moe_decode 20b decode
#   ab:NAME=ENV,...      scripts/decode_ab.py --rounds 2 with the variants NAME=ENV (ENV's pairs joined
#                        by '+'), base first, at 1k and 8k context, batches $AB_BATCHES (default 1,2,8), 20b;
#                        ab120:... the same on 120b (its checkpoint takes ~72 s to write)
#   decode               osprey bench decode at 1k, batches 1,2,4,8,64 (the issue's lines)
# Environment: AB_BATCHES, AB_CONTEXTS (default 1024,8192), STAGE_TIMEOUT (seconds, default 420).
set -uo pipefail
out="${OUT:-$PWD/device-out}"
mkdir -p "$out" .device/cuda
tar -xJf .device/bin.tar.xz -C .device/cuda
B="$PWD/.device/cuda/sel"
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
S="$out/summary.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
limit="${STAGE_TIMEOUT:-420}"
m20="${M20:-/dev/shm/m20}" m120="${M120:-/dev/shm/m120}" abn=0

stage() {  # stage NAME CMD...: runs CMD with its output in $out/NAME.log, notes the status and the time
  local name="$1"; shift
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s" >> "$S"
  return $rc
}
need_model() {  # need_model DIR PRESET
  [[ -f "$1/config.json" ]] || stage "make-$2" "$B/osprey" make-model --preset "$2" --seed 1 --out "$1"
}

for s in "$@"; do
  case "$s" in
    model20) need_model $m20 20b ;;
    model120) need_model $m120 120b ;;
    suite)
      OSPREY_SUITE_TIMEOUT=200 OSPREY_SUITE_SHARDS=12 stage suite bash scripts/gpu_suite.sh --bin "$B" \
        --out "$out/suite" --skip-benches --quick --models ""
      grep -E "FAIL|PASS" "$out/suite.log" | sed 's/^/  /' >> "$S" ;;
    timeline)
      need_model $m20 20b
      for b in 1 8; do
        stage "timeline-b$b" "$B/bench_forward_tl" --model $m20 --prefill 1024 --prompt 1024 --decode 64 --batch $b \
          --timeline
        grep -E "decode batch|^timeline of|^  " "$out/timeline-b$b.log" | grep -v "^  [a-z_]*:" >> "$S"
      done ;;
    trace)
      need_model $m20 20b
      stage trace "$B/bench_forward" --model $m20 --prefill 1024 --prompt 1024 --decode 64 --batch 1 --trace
      grep -E "decode batch|replayed|trace of|share of|  [a-z_].* calls " "$out/trace.log" >> "$S" ;;
    moe)
      stage moe "$B/bench_moe_decode" 20b decode
      grep -E "moe_decode" "$out/moe.log" >> "$S" ;;
    decode)
      need_model $m20 20b
      (cd "$out" && stage decode "$B/osprey" bench decode --model $m20 --contexts 1024 --batches 1,2,4,8,64 --steps 64)
      grep -E "^decode context .* batch" "$out/decode.log" >> "$S" ;;
    ab:*|ab120:*)
      model=$m20 preset=20b
      [[ "$s" == ab120:* ]] && model=$m120 preset=120b
      need_model "$model" $preset
      variants=(--variant base=)
      IFS=',' read -ra vs <<< "${s#*:}"
      for v in "${vs[@]}"; do variants+=(--variant "${v//+/ }"); done
      abn=$((abn + 1))
      echo "== ab$abn: $s" >> "$S"
      stage "ab$abn" python3 scripts/decode_ab.py --osprey "$B/osprey" --rounds 2 --out "$out/ab$abn" "${variants[@]}" \
        -- --model "$model" --contexts "${AB_CONTEXTS:-1024,8192}" --batches "${AB_BATCHES:-1,2,8}" --steps 64
      grep -E "^\|" "$out/ab$abn.log" >> "$S" ;;
    *) echo "== unknown stage $s" >> "$S" ;;
  esac
done
cat "$S"
