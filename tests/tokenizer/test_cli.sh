#!/usr/bin/env bash
# `osprey tokenize` end to end: encode, --allow-special, --decode, errors, and --export-hf-json
# loaded back through --tokenizer / --model giving the same ids.
#   test_cli.sh OSPREY_BINARY RANK_FILE
set -u
osprey=$1
rank=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() {  # name, expected, actual
    if [[ "$2" == "$3" ]]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $1: expected [$2], got [$3]"
    fi
}
fails() {  # name, expected message fragment, command...
    local name=$1 want=$2
    shift 2
    local err
    if err=$("$@" 2>&1 >/dev/null); then
        failed=$((failed + 1)); echo "FAIL $name: succeeded"
    elif [[ "$err" != *"$want"* ]]; then
        failed=$((failed + 1)); echo "FAIL $name: message [$err] lacks [$want]"
    else
        passed=$((passed + 1))
    fi
}

check encode "24912 2375" "$("$osprey" tokenize --tokenizer "$rank" hello world)"
check stdin "24912 2375" "$(printf 'hello world' | "$osprey" tokenize --tokenizer "$rank")"
check specials_as_text "27 91 5236 91 29" "$("$osprey" tokenize --tokenizer "$rank" '<|start|>')"
check allow_special "200006 1428 200008" "$("$osprey" tokenize --tokenizer "$rank" --allow-special '<|start|>user<|message|>')"
check decode "hello world<|end|>" "$("$osprey" tokenize --tokenizer "$rank" --decode '[24912, 2375, 200007]')"
check env_fallback "24912 2375" "$(OSPREY_TIKTOKEN_FILE="$rank" HOME="$tmp" "$osprey" tokenize hello world)"
fails bad_utf8 "invalid UTF-8 at byte 1" bash -c "printf 'a\xff' | '$osprey' tokenize --tokenizer '$rank'"
fails bad_id "outside the vocabulary" "$osprey" tokenize --tokenizer "$rank" --decode 201088
fails not_an_id "not a token id: 'x1'" "$osprey" tokenize --tokenizer "$rank" --decode x1
fails unknown_flag "unknown option --frobnicate" "$osprey" tokenize --frobnicate
fails no_tokenizer "no tokenizer found" env -u OSPREY_TIKTOKEN_FILE HOME="$tmp" "$osprey" tokenize hi
printf 'not a rank file\n' > "$tmp/bad.tiktoken"
fails corrupt_rank_file "bad.tiktoken:1: invalid base64" "$osprey" tokenize --tokenizer "$tmp/bad.tiktoken" hi

mkdir -p "$tmp/model"
"$osprey" tokenize --tokenizer "$rank" --export-hf-json "$tmp/model/tokenizer.json"
check export_exists 0 "$?"
text='Grüße, 日本語 and emoji 👍🏽 <|start|>   12345'
check hf_same_ids "$("$osprey" tokenize --tokenizer "$rank" --allow-special "$text")" \
    "$("$osprey" tokenize --model "$tmp/model" --allow-special "$text")"
printf '{"model": {"type": "BPE"' > "$tmp/broken.json"
fails bad_json "broken.json: invalid JSON" "$osprey" tokenize --tokenizer "$tmp/broken.json" hi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
