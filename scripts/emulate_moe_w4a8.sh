#!/usr/bin/env bash
# Checks the W4A8 MoE GEMMs (src/kernels/cuda/moe_mlp_w4a8.cu: the activation quantisation kernel and the
# FP8 wgmma kernel: tile schedule, producer/consumer mbarrier ring, cp.async swizzles, the stage's
# activation scales, the 8-bit register A fragment and K-major E4M3 descriptor, the exact FP4 -> E4M3
# code tables, scale-d, the per-128-k promotion, bias, epilogues) on a machine without a GPU: compiles
# the device code as C++ against the CPU emulation (tests/kernels/emu: cuda_emulation.h,
# moe_decode_emulation.h, moe_wgmma_emulation.h, moe_w4a8_emulation.h; one std::thread per CUDA
# thread) and compares with the W4A8 CPU reference (kernels/cpu/w4a8_matmul.h) for every variant
# (EMULATE_VARIANT=N runs only N, EMULATE_SHAPE=edges|mid|ring only that shape; EMULATE_INCLUDE=DIR puts
# DIR first on the include path, for running a modified copy of the kernel).
#   usage: scripts/emulate_moe_w4a8.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_moe_w4a8"
mkdir -p "$out"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -include algorithm ${EMULATE_INCLUDE:+-I"$EMULATE_INCLUDE"} -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_moe_w4a8.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_moe_w4a8"
[ "${EMULATE_BUILD_ONLY:-0}" = 1 ] || "$out/emulate_moe_w4a8" "$seed"
