#!/usr/bin/env bash
# `osprey render` and `osprey parse` end to end: conformance outputs, a render -> parse -> render round
# trip, and clear errors (non-zero exit, message naming the field) for malformed input.
#   test_cli.sh OSPREY_BINARY SHARED_DIR
set -u
osprey="$1"
shared="$2"
export OSPREY_TIKTOKEN_FILE="$shared/data/o200k_base.tiktoken"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() {  # name, condition result (0 = pass)
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $1"; fi
}

# 1. Text and tokens of test_no_tools.txt.
conv='{"messages": [{"role": "system", "content": [{"type": "system_content", "conversation_start_date": "2025-06-28"}]}]}'
echo "$conv" > "$tmp/no_tools.json"
"$osprey" render --text "$tmp/no_tools.json" > "$tmp/text.out"
printf '%s\n' "$(cat "$shared/conformance/harmony/test_no_tools.txt")" > "$tmp/text.want"
cmp -s "$tmp/text.out" "$tmp/text.want"; check "render --text matches test_no_tools.txt" $?
want_ids="200006 17360 200008 3575 553 17554 162016 11 261 4410 6439 2359 22203 656 7788 17527 558 87447 100594 25 220 1323 19 12 3218 198 6576 3521 25 220 1323 20 12 3218 12 2029 279 30377 289 25 14093 279 2 13888 18403 25 8450 11 49159 11 1721 13 21030 2804 413 7360 395 1753 3176 13 200007 200006 173781"
[ "$(echo "$conv" | "$osprey" render --tokens)" = "$want_ids" ]; check "render --tokens (stdin) matches the derived ids" $?

# 2. Parse the conformance completion, then render the parsed messages back.
"$osprey" parse "$shared/conformance/harmony/test_simple_reasoning_response.txt" > "$tmp/parsed.json"
grep -q '"text": "2 + 2 = 4."' "$tmp/parsed.json"; check "parse finds the final answer" $?
grep -q '"channel": "analysis"' "$tmp/parsed.json"; check "parse finds the analysis message" $?
"$osprey" render --no-next-role --keep-analysis --text "$tmp/parsed.json" > "$tmp/back.txt"
grep -q '^<|start|>assistant<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|end|>$' "$tmp/back.txt"
check "parse -> render round trip" $?
"$osprey" render --no-next-role --keep-analysis --tokens "$tmp/parsed.json" | "$osprey" parse --no-role > "$tmp/parsed2.json"
cmp -s "$tmp/parsed.json" "$tmp/parsed2.json"; check "render -> parse gives the same messages" $?
echo '[200005, 17196, 200008, 17, 200002]' | "$osprey" parse --events | grep -q '"end":"return"'; check "parse --events" $?

# 3. Errors name the problem.
expect_error() {  # name, needle, command...
    local name="$1" needle="$2"
    shift 2
    "$@" > /dev/null 2> "$tmp/err"
    local rc=$?
    [ $rc -ne 0 ] && grep -qF -- "$needle" "$tmp/err"; check "$name" $?
}
echo '{"messages": [{"role": "bot", "content": "x"}]}' > "$tmp/bad_role.json"
expect_error "unknown role" "messages[0].role: unknown role 'bot'" "$osprey" render "$tmp/bad_role.json"
printf '{"messages": [{"role": "user", "content": "\xff"}]}' > "$tmp/bad_utf8.json"
expect_error "invalid UTF-8" "invalid JSON" "$osprey" render --text "$tmp/bad_utf8.json"
echo '{"messages": [{"role": "developer", "content": [{"type": "developer_content", "tools": {"functions": {"name": "functions", "tools": [{"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}]}}}]}]}' > "$tmp/bad_schema.json"
expect_error "bad JSON schema" "parameters.properties.a.type: unknown JSON-Schema type 'strin'" "$osprey" render --text "$tmp/bad_schema.json"
expect_error "unknown flag" "unknown option --bogus" "$osprey" render --bogus "$tmp/no_tools.json"
echo "12 x 3" > "$tmp/bad_ids.txt"
expect_error "bad token list" "token 1 is 'x'" "$osprey" parse "$tmp/bad_ids.txt"
expect_error "missing file" "cannot open" "$osprey" parse "$tmp/does_not_exist"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
