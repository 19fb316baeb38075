#!/usr/bin/env bash
# Issue 7's H200 run: builds the `osprey` executable (CUDA), writes a synthetic gpt-oss checkpoint
# (20b or 120b preset), then runs
#   osprey bench prefill   batch 1, prompts 1k 2k 4k 8k 16k 32k (5 timed runs after 1 warm-up each)
#   osprey bench decode    batch 1..128 at context 8192, then at context 32768
#   osprey bench plot      PNG + SVG charts of all of the above
#   osprey serve + osprey bench serve   concurrency 1..8 (16 requests each), 16..128 (128 each),
#                          1024-token prompts, 128-token outputs (log-normal spread)
# writing every JSON report, markdown table, chart and log into the output folder. Each step is logged
# to OUT/<step>.log; OUT/summary.txt lists PASS/FAIL and seconds per step. A failed bench step does not
# stop the later ones (the script exits non-zero at the end).
#
#   scripts/gpu_bench.sh [--out DIR] [--build DIR] [--osprey EXE] [--model-dir DIR] [--preset 20b|120b]
#                        [--price USD] [--steps "build model prefill decode8k decode32k plot serve"] [--quick]
#
#   --out DIR        output folder (default $OUT when set, else gpu-logs/bench-<UTC date-time>)
#   --build DIR      build folder (default build-gpu; configured with tests off, only `osprey` is built)
#   --osprey EXE     a prebuilt osprey to use instead of building
#   --model-dir DIR  where the synthetic checkpoint goes (default /tmp/osprey-models/<preset>; reused
#                    when its config.json exists)
#   --preset P       synthetic checkpoint preset (default 20b)
#   --price USD      price per GPU-hour for the cost columns (default 3.00)
#   --steps LIST     the steps to run, in this order (default all); e.g. split across two 10-minute
#                    device commands: --steps "build model prefill" then --steps "decode8k decode32k plot"
#   --quick          a smaller sweep (3 repeats, 16 timed decode steps) to save device time
#
# KV fill for decode (docs/benchmarks.md): context 8192 prefills every sequence for real (128 x 8k =
# 1M prompt tokens); context 32768 prefills one sequence and copies its K/V into every other
# sequence's own pages (--kv-fill copy: distinct memory as in production, one prefill instead of
# 4.2M prompt tokens). Batch sizes whose cache does not fit are skipped and listed in the report.
# Override with KV_FILL_8K / KV_FILL_32K=prefill|copy|shared. The serve step's engine limits:
# SERVE_ARGS (default "--max-num-seqs 128 --max-num-batched-tokens 8192"); SERVE_ENDPOINT=chat|completions
# (default completions: a synthetic checkpoint never writes a Harmony header, so on /v1/chat/completions
# the server's Harmony parser holds its text back and TTFT/TPOT measure that, not the engine; use chat
# for a real checkpoint).
# The commit in the reports is git describe at configure time; where the tree has no .git, set
# OSPREY_COMMIT=<hash> (passed to cmake as -DOSPREY_COMMIT).
# Smoke-testing the script elsewhere: BACKEND=cpu, LENGTHS, BATCHES, CTX_8K, CTX_32K override the sweep
# (e.g. BACKEND=cpu LENGTHS=16,32 BATCHES=1,2 CTX_8K=64 CTX_32K=96 --preset tiny --quick).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-}"
build="$here/build-gpu"
osprey=""
preset="20b"
model_dir=""
price="3.00"
steps="build model prefill decode8k decode32k plot serve"
repeats=5
decode_steps=32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --osprey) osprey="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --price) price="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --quick) repeats=3; decode_steps=16; shift ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "gpu_bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-$here/gpu-logs/bench-$(date -u +%Y%m%d-%H%M%S)}"
model_dir="${model_dir:-/tmp/osprey-models/$preset}"
kv_fill_8k="${KV_FILL_8K:-prefill}"
kv_fill_32k="${KV_FILL_32K:-copy}"
serve_args="${SERVE_ARGS:---max-num-seqs 128 --max-num-batched-tokens 8192}"
serve_endpoint="${SERVE_ENDPOINT:-completions}"
backend="${BACKEND:-cuda}"
lengths="${LENGTHS:-1024,2048,4096,8192,16384,32768}"
batches="${BATCHES:-1,2,4,8,16,32,64,128}"
ctx_8k="${CTX_8K:-8192}"
ctx_32k="${CTX_32K:-32768}"
mkdir -p "$out"
summary="$out/summary.txt"
touch "$summary"
failures=0

note() { echo "$*" | tee -a "$summary"; }
want() { [[ " $steps " == *" $1 "* ]]; }
# run NAME CMD...: CMD's output goes to OUT/NAME.log (and the terminal); notes PASS/FAIL and seconds.
run() {
  local name="$1"; shift
  local t0=$SECONDS rc=0
  echo "+ $*" > "$out/$name.log"
  "$@" 2>&1 | tee -a "$out/$name.log" || rc=$?
  if [[ $rc -eq 0 ]]; then
    note "PASS $name ($((SECONDS - t0)) s)"
  else
    note "FAIL $name (rc $rc, $((SECONDS - t0)) s): see $name.log"
    failures=$((failures + 1))
  fi
  return $rc
}

note "gpu_bench: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 \
  | tee -a "$summary" || true

if [[ -z "$osprey" ]]; then
  osprey="$build/osprey"
  if want build; then
    if [[ ! -f "$build/build.ninja" ]]; then
      run configure cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_TESTS=OFF \
        ${OSPREY_COMMIT:+-DOSPREY_COMMIT="$OSPREY_COMMIT"} || exit 1
    fi
    run build ninja -C "$build" osprey || exit 1
  fi
fi
[[ -x "$osprey" ]] || { note "FAIL: no osprey executable at $osprey (run the build step or pass --osprey)"; exit 1; }
note "$("$osprey" --version) (the commit every report records)"

if want model; then
  if [[ -f "$model_dir/config.json" ]]; then
    note "SKIP model ($model_dir/config.json exists)"
  else
    mkdir -p "$(dirname "$model_dir")"
    run make_model "$osprey" make-model --out "$model_dir" --preset "$preset" --seed 1 --threads "$(nproc)" || exit 1
  fi
fi

common=(--model "$model_dir" --backend "$backend" --gpu-price "$price" --tp 1 --ep 1 --dp 1)
if want prefill; then
  run prefill "$osprey" bench prefill "${common[@]}" --lengths "$lengths" \
    --repeats "$repeats" --warmup 1 --out "$out/prefill" || true
fi
if want decode8k; then
  run decode_8k "$osprey" bench decode "${common[@]}" --batches "$batches" --contexts "$ctx_8k" \
    --steps "$decode_steps" --warmup 4 --kv-fill "$kv_fill_8k" --out "$out/decode-8k" || true
fi
if want decode32k; then
  run decode_32k "$osprey" bench decode "${common[@]}" --batches "$batches" --contexts "$ctx_32k" \
    --steps "$decode_steps" --warmup 4 --kv-fill "$kv_fill_32k" --out "$out/decode-32k" || true
fi
if want plot; then
  reports=()
  for f in "$out"/prefill.json "$out"/decode-8k.json "$out"/decode-32k.json; do
    [[ -f "$f" ]] && reports+=("$f")
  done
  if [[ ${#reports[@]} -gt 0 ]]; then
    run plot "$osprey" bench plot "${reports[@]}" --out "$out/plots" || true
  else
    note "SKIP plot (no reports in $out)"
  fi
fi

if want serve; then
  port="${SERVE_PORT:-8124}"
  # shellcheck disable=SC2086  # serve_args is a list of flags
  "$osprey" serve --model "$model_dir" --backend "$backend" --port "$port" $serve_args > "$out/serve.log" 2>&1 &
  server=$!
  up=0
  for _ in $(seq 1 300); do
    if curl -sf "127.0.0.1:$port/health" > /dev/null; then up=1; break; fi
    kill -0 "$server" 2> /dev/null || break
    sleep 1
  done
  if [[ $up -eq 1 ]]; then
    url="http://127.0.0.1:$port"
    run serve_low "$osprey" bench serve --url "$url" --concurrency "${SERVE_LOW:-1,2,4,8}" --requests 16 \
      --endpoint "$serve_endpoint" --input-len 1024 --output-len 128 --gpu-price "$price" --out "$out/serve-low" || true
    run serve_high "$osprey" bench serve --url "$url" --concurrency "${SERVE_HIGH:-16,32,64,128}" --requests 128 \
      --endpoint "$serve_endpoint" --input-len 1024 --output-len 128 --gpu-price "$price" --out "$out/serve-high" || true
    curl -s "$url/metrics" > "$out/serve-metrics.txt" || true
  else
    note "FAIL serve: the server did not answer /health (see serve.log)"
    failures=$((failures + 1))
  fi
  kill "$server" 2> /dev/null; wait "$server" 2> /dev/null || true
fi

note "gpu_bench: $failures failure(s); results in $out"
[[ $failures -eq 0 ]]
