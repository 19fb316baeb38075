#!/usr/bin/env bash
# One H200 call that re-checks the GPU tests and takes the end-to-end measurements of the engine
# (osprey generate --batch), the benchmark tool (osprey bench prefill/decode/plot) and the server
# (osprey serve + osprey bench serve) on a synthetic gpt-oss-20b, with prebuilt binaries.
#   OUT=DIR OSPREY_COMMIT=<hash> scripts/gpu_measure_20b.sh BIN_DIR RANK_FILE
# BIN_DIR holds osprey and the GPU test binaries (built here with nvcc, sm_90a); RANK_FILE is an
# o200k_base.tiktoken for the server's tokenizer. Results: OUT/summary.txt and OUT/results.tar.gz
# (packed after each phase, so a run cut short still returns what it measured). About 3 minutes.
set -u
B="$(cd "$1" && pwd)"; W="$OUT/work"; mkdir -p "$W"
S="$OUT/summary.txt"; : > "$S"
export OSPREY_COMMIT="${OSPREY_COMMIT:-unknown}" OSPREY_TIKTOKEN_FILE="$(realpath "$2")" OSPREY_CACHE="$W/cache"
pack() { tar czf "$OUT/results.tar.gz" -C "$W" --exclude cache . 2>/dev/null; }
note() { echo "$*" | tee -a "$S"; }
step() { local name="$1" lim="$2"; shift 2; local t0=$SECONDS
  timeout "$lim" "$@" > "$W/$name.log" 2>&1; local rc=$?
  note "$([[ $rc == 0 ]] && echo PASS || echo "FAIL rc=$rc") $name $((SECONDS-t0))s"; tail -4 "$W/$name.log" | sed 's/^/    /' >> "$S"; return $rc; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$S"
for t in test_sampling_cuda test_cuda_forward; do
  step "$t" 90 "$B/$t"
done
pack
M=/dev/shm/m20
step make_model_20b 60 "$B/osprey" make-model --preset 20b --seed 1 --out $M
P=$(seq -s, 1000 2023)
step gen_b1 60 "$B/osprey" generate --device cuda --model $M --prompt-ids "$P" --max-tokens 256 --ignore-eos
for n in 1 8 32 64 128; do
  step gen_batch_$n 90 "$B/osprey" generate --device cuda --model $M --prompt-ids "$P" --max-tokens 256 --ignore-eos \
    --batch $n --prompts distinct --max-num-seqs $n --max-batch-tokens 8192
done
pack
step gen_prefix_shared_32 60 "$B/osprey" generate --device cuda --model $M --prompt-ids "$(seq -s, 1000 5095)" --max-tokens 32 --ignore-eos --batch 32 --prompts shared --max-num-seqs 32 --max-batch-tokens 8192
step gen_prefix_off_32 60 "$B/osprey" generate --device cuda --model $M --prompt-ids "$(seq -s, 1000 5095)" --max-tokens 32 --ignore-eos --batch 32 --prompts shared --prefix-cache off --max-num-seqs 32 --max-batch-tokens 8192
step bench_prefill 120 "$B/osprey" bench prefill --backend cuda --model $M --repeats 3 --out "$W/prefill"
step bench_decode 180 "$B/osprey" bench decode --backend cuda --model $M --kv-fill shared --steps 16 --warmup 2 --out "$W/decode"
pack
"$B/osprey" serve --model $M --backend cuda --port 8124 > "$W/serve.log" 2>&1 &
spid=$!
for i in $(seq 1 60); do curl -s 127.0.0.1:8124/health > /dev/null && break; sleep 1; done
step bench_serve_low 60 "$B/osprey" bench serve --url http://127.0.0.1:8124 --concurrency 1,8 --requests 16 --input-len 1024 --output-len 128 --out "$W/serve_low"
step bench_serve_high 90 "$B/osprey" bench serve --url http://127.0.0.1:8124 --concurrency 32,64,128 --requests 128 --input-len 1024 --output-len 128 --out "$W/serve_high"
curl -s 127.0.0.1:8124/metrics > "$W/metrics.txt"
kill $spid; wait $spid
for t in test_argmax test_embed test_rmsnorm_cuda test_rope_cuda test_linear test_attention_cuda test_moe_route test_moe_group test_moe_mlp; do
  step "$t" 90 "$B/$t"
done
step plot 30 "$B/osprey" bench plot "$W/prefill.json" "$W/decode.json" --out "$W/plots"
pack
cp "$S" "$OUT/summary.txt" 2>/dev/null; true
