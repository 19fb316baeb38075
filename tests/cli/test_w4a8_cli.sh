#!/usr/bin/env bash
# --moe-gemm w4a8 (the W4A8 MoE arithmetic; on the CPU backend its reference, docs/fp8.md "W4A8") through
# the executable: generate keeps the tiny synthetic model's greedy path, `osprey accuracy` compares it
# with the published arithmetic within bounds, a bad value is refused. usage: test_w4a8_cli.sh OSPREY_EXE
set -euo pipefail
osprey="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$osprey" make-model --out "$dir/tiny" --threads 2 > /dev/null
gen() { "$osprey" generate --model "$dir/tiny" --prompt-ids 5,6,7,8 --max-tokens 6 --threads 2 "$@" 2>/dev/null | grep '^tokens:'; }
want="$(gen)"
got="$(gen --moe-gemm w4a8)" || fail "generate --moe-gemm w4a8"
[ "$got" = "$want" ] || fail "generate --moe-gemm w4a8: $got, want $want"
got="$(gen --moe-gemm w4a16)" || fail "generate --moe-gemm w4a16"
[ "$got" = "$want" ] || fail "generate --moe-gemm w4a16: $got, want $want"
if "$osprey" generate --model "$dir/tiny" --moe-gemm fp4 --prompt-ids 1 2> "$dir/err"; then
    fail "--moe-gemm fp4 accepted"
fi
grep -q 'expected w4a16' "$dir/err" || fail "unclear --moe-gemm error: $(cat "$dir/err")"

"$osprey" accuracy --model "$dir/tiny" --backend cpu --moe-gemm w4a8 --threads 2 --positions 32 --chunk 16 \
    --prompt-tokens 8 --greedy 8 --out "$dir/acc.json" --max-kl 1e-6 --min-top1 0.99 --min-greedy-prefix 8 \
    --max-layer-error 0.01 > "$dir/acc.txt" 2>/dev/null || { cat "$dir/acc.txt"; fail "accuracy bounds"; }
grep -q 'MoE W4A8' "$dir/acc.txt" || fail "the candidate is not named W4A8: $(head -3 "$dir/acc.txt")"
grep -q '"mean_kl"' "$dir/acc.json" || fail "no accuracy report"
echo "w4a8 cli: ok"
