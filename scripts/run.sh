#!/usr/bin/env bash
# Builds Osprey and runs the main job, the OpenAI-compatible server, on the built-in tiny model (or on
# --model DIR when given). Usage: bash scripts/run.sh [osprey serve options, e.g. --port 8000]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/deps.sh"

osprey_apt_deps
osprey_build osprey

# The server needs the o200k_harmony tokenizer; the tiny model has none of its own.
shared="${OSPREY_SHARED_DIR:-$OSPREY_ROOT/../shared}"
if [ -z "${OSPREY_TIKTOKEN_FILE:-}" ] && [ -f "$shared/data/o200k_base.tiktoken" ]; then
    export OSPREY_TIKTOKEN_FILE="$shared/data/o200k_base.tiktoken"
fi
exec "$OSPREY_ROOT/build/osprey" serve "$@"
