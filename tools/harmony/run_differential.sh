#!/usr/bin/env bash
# Differential run of Osprey's Harmony renderer/parser against openai-harmony 0.0.8:
# generates N random conversations and N random completion streams, then replays them with test_harmony.
#   tools/harmony/run_differential.sh [BUILD_DIR] [N] [SEED]
# Needs python3 with venv; installs openai-harmony into $OSPREY_HARMONY_VENV (default /tmp/venv-harmony).
# No network beyond PyPI: the tokenizer comes from shared/data/o200k_base.tiktoken.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${1:-$repo/build}"
n="${2:-1000}"
seed="${3:-1}"
shared="${OSPREY_SHARED_DIR:-$repo/../shared}"
# OSPREY_PYTHON (the test venv of scripts/deps.sh, which has openai-harmony) is used as it is;
# otherwise a venv of our own is made.
py="${OSPREY_PYTHON:-}"
if [ -z "$py" ]; then
    venv="${OSPREY_HARMONY_VENV:-/tmp/venv-harmony}"
    if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
    "$venv/bin/python" -c "import openai_harmony" 2>/dev/null || "$venv/bin/pip" install -q "openai-harmony==0.0.8"
    py="$venv/bin/python"
fi
cases="$(mktemp /tmp/osprey-harmony-diff-XXXXXX.jsonl)"
trap 'rm -f "$cases"' EXIT
"$py" "$here/differential.py" --conversations "$n" --streams "$n" --seed "$seed" --shared "$shared" --out "$cases"
OSPREY_HARMONY_DIFF_CASES="$cases" "$build/tests/harmony/test_harmony" --gtest_filter='harmony_differential.*'
