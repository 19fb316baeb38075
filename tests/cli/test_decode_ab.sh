#!/usr/bin/env bash
# scripts/decode_ab.py against the CPU backend and the built-in tiny model: two variants alternated over
# two rounds give a table with both (the second with its ratio to the first), a bad variant is refused
# before anything runs, and a failing bench run makes the script fail.
#   usage: tests/cli/test_decode_ab.sh OSPREY PYTHON
set -euo pipefail
osprey="${1:?usage: $0 OSPREY PYTHON}"
python="${2:?usage: $0 OSPREY PYTHON}"
script="$(cd "$(dirname "$0")/../.." && pwd)/scripts/decode_ab.py"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$python" "$script" --osprey "$osprey" --rounds 2 --out "$out/ok" --variant base= --variant knob="OSPREY_DECODE_AB_TEST=1" \
    -- --backend cpu --contexts 64 --batches 1,2 --steps 2 --warmup 1 > "$out/ok.txt" 2>&1 || fail "two variants: rc $?"
grep -q '^round 2 knob: rc 0: c64 b1 [0-9.]*; c64 b2 [0-9.]*$' "$out/ok.txt" || fail "no round 2 summary"
grep -qE '^\| 64 \| 2 \| [0-9.]+ \([0-9.]+ / [0-9.]+\) \| [0-9.]+ \([0-9.]+ / [0-9.]+, [0-9.]+x\) \|$' "$out/ok.txt" ||
    fail "no table row for batch 2"
[[ -f "$out/ok/base-1.md" && -f "$out/ok/knob-2.md" ]] || fail "the bench logs are missing"

# NAME@BINARY=ENV runs that binary (here a wrapper that leaves a mark, then runs osprey).
printf '#!/usr/bin/env bash\ntouch "%s/wrapper-ran"\nexec "%s" "$@"\n' "$out" "$osprey" > "$out/wrapped-osprey"
chmod +x "$out/wrapped-osprey"
"$python" "$script" --osprey "$osprey" --rounds 1 --out "$out/bin" --variant base= --variant "other@$out/wrapped-osprey=" \
    -- --backend cpu --contexts 64 --batches 1 --steps 2 --warmup 1 > "$out/bin.txt" 2>&1 || fail "a binary variant: rc $?"
[[ -f "$out/wrapper-ran" ]] || fail "the variant's binary did not run"
grep -q '^round 1 other: rc 0: c64 b1 [0-9.]*$' "$out/bin.txt" || fail "no summary for the binary variant"
if "$python" "$script" --osprey "$osprey" --variant "x@$out/no-such-binary=" -- --backend cpu > "$out/nobin.txt" 2>&1; then
    fail "a missing variant binary was accepted"
fi
grep -q "is not an executable" "$out/nobin.txt" || fail "no message for the missing binary"

if "$python" "$script" --osprey "$osprey" --variant 'bad name=' -- --backend cpu > "$out/bad.txt" 2>&1; then
    fail "a bad variant name was accepted"
fi
grep -q "is not NAME=ENV or NAME@BINARY=ENV" "$out/bad.txt" || fail "no message for the bad variant"

if "$python" "$script" --osprey "$osprey" --rounds 1 --variant a= -- --backend cpu --contexts 64 --batches 1 \
    --no-such-option > "$out/fail.txt" 2>&1; then
    fail "a failing bench run passed"
fi
grep -q "unknown option --no-such-option" "$out/fail.txt" || fail "the bench's error is not shown"
echo "decode_ab: ok"
