#!/usr/bin/env bash
# Installs what building and testing Osprey needs on a Debian machine; safe to run again (it only
# installs what is missing). Sourced by scripts/run.sh and scripts/test.sh.
#   OSPREY_VENV   python virtual environment for the test tools (default: <repo>/.venv)
set -euo pipefail

OSPREY_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OSPREY_VENV="${OSPREY_VENV:-$OSPREY_ROOT/.venv}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages: compiler, build tools, GoogleTest, OpenSSL, Python for the differential tests.
osprey_apt_deps() {
    # libssl-dev + openssl: TLS (--ssl-certfile) and the certificate its test makes.
    local pkgs=(g++ cmake ninja-build libgtest-dev libssl-dev openssl python3 python3-venv python3-pip ca-certificates curl)
    pkgs+=("$@")
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "osprey: installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Python packages used by tests and tools only (never by the product), pinned for reproducibility.
osprey_python_deps() {
    if [ ! -x "$OSPREY_VENV/bin/python" ]; then
        python3 -m venv "$OSPREY_VENV"
    fi
    local req="$OSPREY_ROOT/scripts/requirements-test.txt"
    local stamp="$OSPREY_VENV/.osprey-req.sha256"
    local want
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        "$OSPREY_VENV/bin/python" -m pip install -q --upgrade pip
        "$OSPREY_VENV/bin/python" -m pip install -q -r "$req"
        echo "$want" >"$stamp"
    fi
}

# NCCL for the CUDA backend's collectives (cmake/Nccl.cmake finds it). Only with nvcc: the CUDA
# toolkit image ships NCCL (include/nccl.h, lib64/libnccl.so.2); where it does not, and no system copy
# exists, the pip package of the same version built for CUDA 13 goes into the venv (headers and
# libnccl.so.2; the build's rpath points there, a GPU machine uses its own system-wide libnccl.so.2).
OSPREY_NCCL_PIP="nvidia-nccl-cu13==2.28.9"
osprey_nccl_deps() {
    local nvcc
    nvcc="$(command -v nvcc || true)"
    [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
    [ -z "$nvcc" ] && return 0
    local cuda_root
    cuda_root="$(cd "$(dirname "$nvcc")/.." && pwd)"
    for inc in "${OSPREY_NCCL_ROOT:-/nonexistent}/include" "$cuda_root/include" /usr/include /usr/local/include; do
        [ -f "$inc/nccl.h" ] && return 0
    done
    if [ ! -x "$OSPREY_VENV/bin/python" ]; then
        python3 -m venv "$OSPREY_VENV"
    fi
    if ! compgen -G "$OSPREY_VENV/lib/python3*/site-packages/nvidia/nccl/include/nccl.h" >/dev/null; then
        echo "osprey: installing NCCL into $OSPREY_VENV ($OSPREY_NCCL_PIP)"
        "$OSPREY_VENV/bin/python" -m pip install -q "$OSPREY_NCCL_PIP"
    fi
}

# Configures and builds into <repo>/build (Release, Ninja). nvcc, when present, adds the CUDA backend.
osprey_build() {
    local jobs="${OSPREY_JOBS:-$(nproc)}"
    local shared="${OSPREY_SHARED_DIR:-$OSPREY_ROOT/../shared}"
    osprey_nccl_deps
    cmake -S "$OSPREY_ROOT" -B "$OSPREY_ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DOSPREY_SHARED_DIR="$shared" -DOSPREY_PYTHON="$OSPREY_VENV/bin/python" >/dev/null
    cmake --build "$OSPREY_ROOT/build" -j "$jobs" "$@"
}
