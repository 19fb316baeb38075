#!/usr/bin/env bash
# Issue 13 item 4 on the H200: serving under load with and without the per-step prefill budget of
# steps that decode (`osprey serve --max-mixed-prefill-tokens`). Writes a synthetic gpt-oss-20b
# checkpoint (skipped when it exists), then for each budget configuration starts `osprey serve`
# on it and runs `osprey bench serve --endpoint completions` at each concurrency (closed loop,
# fixed prompt and output lengths), one level per call, and prints TTFT / ITL / TPOT / throughput
# per configuration and concurrency. About 5-6 minutes on the H200 with the defaults and a prebuilt
# osprey (make-model ~1 min, then ~80 s per configuration).
#
#   scripts/bench_serve_load.sh --tokenizer O200K_FILE [--out DIR] [--osprey EXE] [--model-dir DIR]
#                               [--configs "off 512 256"]
#
#   --tokenizer FILE  o200k_base.tiktoken for the server (the synthetic checkpoint has none)
#   --out DIR         logs and reports (default $OUT when set, else gpu-logs/serve-load-<UTC time>)
#   --osprey EXE      the osprey executable (default build-gpu/osprey, else build/osprey)
#   --model-dir DIR   the checkpoint (default /dev/shm/m20; written with make-model --preset $PRESET)
#   --configs LIST    budget configurations, run in this order: "off" (no limit: prefill takes what
#                     the decodes leave of the step, the behaviour before the limit), "N" (at most N
#                     prefill tokens in a step that decodes), "N:M" (... once M or more decode).
#
# Environment overrides (defaults in brackets): CONCURRENCY ["1 8 32 64 128"], REQ_FACTOR [4] and
# REQ_MIN [8] (requests per level: max(REQ_MIN, REQ_FACTOR x concurrency)), INPUT_LEN [1024],
# OUTPUT_LEN [128], LEN_SIGMA [0: fixed lengths; 0.5 is what docs/performance.md's server table used],
# SERVE_ARGS ["--max-num-seqs 128 --max-num-batched-tokens 8192", as that table], BACKEND [cuda],
# PRESET [20b], PORT [8130, one more per configuration], LEVEL_TIMEOUT [150 s per level].
# Smoke test on a CPU machine: BACKEND=cpu PRESET=tiny CONCURRENCY="1 4" INPUT_LEN=48 OUTPUT_LEN=8
# scripts/bench_serve_load.sh --tokenizer ~/.cache/osprey/o200k_base.tiktoken --model-dir /tmp/tiny-m
# --configs "off 64"
#
# Output: OUT/summary.txt (the table below, also printed), OUT/<config>/serve.log (the server's log:
# its engine line states the budget in force), OUT/<config>/c<N>.{json,md,log} (bench serve per level),
# OUT/<config>/metrics.txt (the server's /metrics after the last level).
set -uo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-}"
osprey=""
tokenizer=""
model_dir="/dev/shm/m20"
configs="off 512 256"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tokenizer) tokenizer="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --osprey) osprey="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "bench_serve_load: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$tokenizer" && -f "$tokenizer" ]] || { echo "bench_serve_load: --tokenizer FILE is required" >&2; exit 2; }
tokenizer="$(realpath "$tokenizer")"
if [[ -z "$osprey" ]]; then
  for c in "$here/build-gpu/osprey" "$here/build/osprey"; do [[ -x "$c" ]] && { osprey="$c"; break; }; done
fi
[[ -n "$osprey" && -x "$osprey" ]] || { echo "bench_serve_load: no osprey executable (pass --osprey)" >&2; exit 2; }
out="${out:-$here/gpu-logs/serve-load-$(date -u +%Y%m%d-%H%M%S)}"
concurrency="${CONCURRENCY:-1 8 32 64 128}"
req_factor="${REQ_FACTOR:-4}"
req_min="${REQ_MIN:-8}"
input_len="${INPUT_LEN:-1024}"
output_len="${OUTPUT_LEN:-128}"
len_sigma="${LEN_SIGMA:-0}"
serve_args="${SERVE_ARGS:---max-num-seqs 128 --max-num-batched-tokens 8192}"
backend="${BACKEND:-cuda}"
preset="${PRESET:-20b}"
port="${PORT:-8130}"
level_timeout="${LEVEL_TIMEOUT:-150}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
failures=0
t_start=$SECONDS

note() { echo "$*" | tee -a "$summary"; }
note "bench_serve_load: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname); $("$osprey" --version 2>&1 | head -1)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee -a "$summary"
note "workload: /v1/completions, closed loop, prompts ~$input_len words, max_tokens $output_len (sigma $len_sigma);"
note "server: --backend $backend $serve_args; configs: $configs"

if [[ -f "$model_dir/config.json" ]]; then
  note "model: $model_dir exists, reused"
else
  t0=$SECONDS
  if "$osprey" make-model --preset "$preset" --seed 1 --out "$model_dir" --threads "$(nproc)" > "$out/make_model.log" 2>&1; then
    note "model: make-model --preset $preset -> $model_dir ($((SECONDS - t0)) s)"
  else
    note "FAIL make-model (see make_model.log)"; exit 1
  fi
fi

# The server's flags for one configuration: off, N or N:M.
budget_flags() {
  case "$1" in
    off) echo "--max-mixed-prefill-tokens 0" ;;
    *:*) echo "--max-mixed-prefill-tokens ${1%%:*} --mixed-prefill-min-decodes ${1##*:}" ;;
    *) echo "--max-mixed-prefill-tokens $1" ;;
  esac
}

# One row of a bench serve markdown report: the table row of concurrency $2 in file $1.
level_row() { grep -E "^\| $2 \|" "$1" | head -1; }

rows=()
for cfg in $configs; do
  dir="$out/${cfg//:/-}"
  mkdir -p "$dir"
  url="http://127.0.0.1:$port"
  # shellcheck disable=SC2086,SC2046  # flag lists, split on purpose
  "$osprey" serve --model "$model_dir" --backend "$backend" --tokenizer "$tokenizer" --port "$port" \
    $serve_args $(budget_flags "$cfg") > "$dir/serve.log" 2>&1 &
  server=$!
  t0=$SECONDS
  up=0
  for _ in $(seq 1 240); do
    if curl -sf "$url/health" > /dev/null 2>&1; then up=1; break; fi
    kill -0 "$server" 2> /dev/null || break
    sleep 0.5
  done
  if [[ $up -ne 1 ]]; then
    note "FAIL $cfg: the server did not answer /health (see $dir/serve.log)"
    failures=$((failures + 1))
    kill "$server" 2> /dev/null; wait "$server" 2> /dev/null
    port=$((port + 1))
    continue
  fi
  note "config $cfg: server up in $((SECONDS - t0)) s; $(grep -m1 'tokens per step' "$dir/serve.log" | sed 's/.*engine: //')"
  # Warm-up (first-call costs: allocations, graph captures), not measured.
  timeout 60 "$osprey" bench serve --url "$url" --endpoint completions --concurrency 4 --requests 8 \
    --input-len 64 --output-len 16 --len-sigma 0 --out "$dir/warmup" > "$dir/warmup.log" 2>&1 || true
  for c in $concurrency; do
    n=$((req_factor * c)); [[ $n -lt $req_min ]] && n=$req_min
    t0=$SECONDS
    if timeout "$level_timeout" "$osprey" bench serve --url "$url" --endpoint completions --concurrency "$c" \
        --requests "$n" --input-len "$input_len" --output-len "$output_len" --len-sigma "$len_sigma" \
        --out "$dir/c$c" > "$dir/c$c.log" 2>&1; then
      row="$(level_row "$dir/c$c.md" "$c")"
      rows+=("$cfg|$row")
      echo "  $cfg c=$c: $n requests in $((SECONDS - t0)) s"
    else
      note "FAIL $cfg c=$c (rc $?, $((SECONDS - t0)) s): see $dir/c$c.log"
      failures=$((failures + 1))
    fi
  done
  curl -s "$url/metrics" > "$dir/metrics.txt" 2>/dev/null || true
  kill "$server" 2> /dev/null; wait "$server" 2> /dev/null
  port=$((port + 1))
done

# The table: bench serve's columns are concurrency | ok/failed | req/s | output tokens/s | TTFT median |
# TTFT p90 | ITL median | ITL p90 | TPOT median | E2E median | E2E p90 | USD / M output tokens.
note ""
note "$(printf '%-8s %5s %8s %7s %9s %10s %10s %9s %9s %10s %9s' config conc ok/fail req/s 'out tok/s' \
  'TTFT med' 'TTFT p90' 'ITL med' 'ITL p90' 'TPOT med' 'E2E med')"
note "$(printf '%-8s %5s %8s %7s %9s %10s %10s %9s %9s %10s %9s' '' '' '' '' '' '(ms)' '(ms)' '(ms)' '(ms)' '(ms)' '(s)')"
for r in "${rows[@]}"; do
  cfg="${r%%|*}"
  IFS='|' read -r -a f <<< "${r#*|}"
  trim() { echo "$1" | xargs; }
  note "$(printf '%-8s %5s %8s %7s %9s %10s %10s %9s %9s %10s %9s' "$cfg" "$(trim "${f[1]}")" "$(trim "${f[2]}")" \
    "$(trim "${f[3]}")" "$(trim "${f[4]}")" "$(trim "${f[5]}")" "$(trim "${f[6]}")" "$(trim "${f[7]}")" \
    "$(trim "${f[8]}")" "$(trim "${f[9]}")" "$(trim "${f[10]}")")"
done
note ""
note "bench_serve_load: $failures failure(s), $((SECONDS - t_start)) s; results in $out"
[[ $failures -eq 0 ]]
