#!/usr/bin/env bash
# Checks the matrix-expert MoE GEMMs (src/kernels/cuda/moe_mlp_matrix.cu: FP8 W8A8 and BF16; the tile
# schedule, producer/consumer mbarrier ring, the cp.async swizzles of both operands with zero fill past
# a partial k-block and a partial m-tile, the stage's activation scales, the K-major A and B descriptors
# of the SS wgmma forms (E4M3 k32, BF16 k16), scale-d, the per-128-k promotion with the weight block
# multipliers, bias, epilogues; and the natural-order activation quantisation of moe_mlp_w4a8.cu) on a
# machine without a GPU: compiles the device code as C++ against the CPU emulation (tests/kernels/emu:
# cuda_emulation.h, moe_decode_emulation.h, moe_wgmma_emulation.h, moe_w4a8_emulation.h; one std::thread
# per CUDA thread) and compares with the CPU references (kernels/cpu/w8a8_matmul.h, matmul_bf16w) for
# every variant each format takes (EMULATE_VARIANT=N only N, EMULATE_FORMAT=fp8|bf16 one format,
# EMULATE_SHAPE=edges|mid|ring one shape; EMULATE_INCLUDE=DIR puts DIR first on the include path, for
# running a modified copy of the kernel).
#   usage: scripts/emulate_moe_matrix.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_moe_matrix"
mkdir -p "$out"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -include algorithm ${EMULATE_INCLUDE:+-I"$EMULATE_INCLUDE"} -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_moe_matrix.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_moe_matrix"
[ "${EMULATE_BUILD_ONLY:-0}" = 1 ] || "$out/emulate_moe_matrix" "$seed"
