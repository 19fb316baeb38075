#!/usr/bin/env bash
# Makes the golden files of tests/model/test_parity.cpp: writes the synthetic tiny checkpoint with
# `osprey make-model` (preset tiny, seed 0) and runs Hugging Face transformers on it (tools/hf_parity.py,
# float32, MXFP4 experts dequantised). Run it wherever torch + transformers are installed (the GPU
# machine, or a CPU venv); the manifest records the machine, versions and this exact command.
#
#   usage: tools/make_parity_goldens.sh OSPREY_BINARY OUT_DIR [cpu|cuda]
#   then:  cp OUT_DIR/* tests/data/parity/   (and run test_parity)
#
# Python packages: torch, transformers (5.x; goldens made with 5.17.0), safetensors, numpy.
# The goldens depend on the synthetic writer's exact bytes: if src/model/synthetic.cpp changes what it
# writes for seed 0, test_parity reports a checksum mismatch and this script must be run again.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 OSPREY_BINARY OUT_DIR [cpu|cuda]" >&2
    exit 2
fi
osprey=$1
out=$2
device=${3:-}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
seed=0
preset=tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$osprey" make-model --preset "$preset" --seed "$seed" --out "$work/model"
device_flag=()
if [[ -n "$device" ]]; then device_flag=(--device "$device"); fi
"$python" "$here/hf_parity.py" --model "$work/model" --out "$out" --seed "$seed" --preset "$preset" "${device_flag[@]}" \
    --command "tools/make_parity_goldens.sh OSPREY_BINARY OUT_DIR ${device} (osprey make-model --preset $preset --seed $seed; tools/hf_parity.py)"
ls -l "$out"
