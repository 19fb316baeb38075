#!/usr/bin/env bash
# Builds Osprey and runs the main job on the built-in tiny model (or on --model DIR when given).
# Usage: bash scripts/run.sh [osprey generate options]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/deps.sh"

osprey_apt_deps
osprey_build osprey

exec "$OSPREY_ROOT/build/osprey" generate "$@"
