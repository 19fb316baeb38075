#!/usr/bin/env bash
# `osprey convert --to fp8`, the --weights / --kv-cache-dtype flags and `osprey accuracy` end to end on
# the CPU backend with a tiny synthetic model (docs/fp8.md). usage: test_fp8_cli.sh OSPREY_EXE
set -euo pipefail
osprey="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$osprey" make-model --out "$dir/tiny" --threads 2 > /dev/null
echo '{"tokenizer": "copied as it is"}' > "$dir/tiny/tokenizer_config.json"
"$osprey" convert --to fp8 --model "$dir/tiny" --out "$dir/fp8" --threads 2 > /dev/null
grep -q '"quant_method": "fp8"' "$dir/fp8/config.json" || fail "no fp8 quantization_config"
grep -q '"weight_block_size": \[' "$dir/fp8/config.json" || fail "no weight_block_size"
cmp -s "$dir/tiny/tokenizer_config.json" "$dir/fp8/tokenizer_config.json" || fail "tokenizer_config.json not copied"
grep -q 'lm_head.weight_scale_inv' "$dir/fp8/model.safetensors.index.json" || fail "no lm_head.weight_scale_inv"

gen() { "$osprey" generate --prompt-ids 5,6,7,8 --max-tokens 6 --threads 2 "$@" 2>/dev/null | grep '^tokens:'; }
want="$(gen --model "$dir/tiny")"
for flags in "--model $dir/fp8" "--model $dir/tiny --weights fp8" "--model $dir/tiny --weights bf16" \
             "--model $dir/fp8 --weights bf16" "--model $dir/tiny --kv-cache-dtype fp8" \
             "--model $dir/tiny --weights fp8 --convert attention,unembedding --kv-cache-dtype fp8"; do
    # shellcheck disable=SC2086  # the flag lists split on purpose
    got="$(gen $flags)" || fail "generate $flags"
    [ "$got" = "$want" ] || fail "generate $flags: $got, want $want (the synthetic model's greedy path)"
done
if "$osprey" generate --model "$dir/fp8" --weights mxfp4 --prompt-ids 1 2> "$dir/err"; then fail "mxfp4 from fp8 accepted"; fi
grep -q 'cannot be recovered' "$dir/err" || fail "unclear mxfp4 error: $(cat "$dir/err")"

"$osprey" accuracy --model "$dir/tiny" --weights fp8 --kv-cache-dtype fp8 --threads 2 --positions 32 --chunk 16 \
    --prompt-tokens 8 --greedy 8 --out "$dir/acc.json" --max-kl 1e-6 --min-top1 0.99 --min-greedy-prefix 8 \
    --max-layer-error 0.02 > "$dir/acc.txt" 2>/dev/null || { cat "$dir/acc.txt"; fail "accuracy bounds"; }
grep -q '"mean_kl"' "$dir/acc.json" || fail "no accuracy report"
echo "fp8 cli: ok"
