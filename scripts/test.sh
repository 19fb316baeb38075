#!/usr/bin/env bash
# Builds Osprey and runs every test: the CPU suite everywhere, and the GPU suite too when a GPU is present.
# Usage: bash scripts/test.sh            (from a clean clone on a Debian machine; installs what it needs)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/deps.sh"

osprey_apt_deps chromium  # headless browser for the chat-page check (tools/server/chat_page_check.py)
osprey_python_deps
osprey_build

cd "$OSPREY_ROOT/build"
labels="cpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    labels="cpu|gpu"
fi
export OSPREY_PYTHON="$OSPREY_VENV/bin/python"
ctest -L "$labels" --output-on-failure -j "${OSPREY_TEST_JOBS:-$(nproc)}" --timeout 900
