#!/usr/bin/env bash
# Checks the wgmma MoE expert GEMMs' logic (tile schedule, producer/consumer mbarrier ring, cp.async
# swizzle, shared-memory descriptors, wgmma fragment layouts and the lazily executed wait_group, FP4
# decode (into registers, or for the SS variants into the swizzled shared-memory A tile and its second
# mbarrier ring), bias in the accumulators, epilogues) on a machine without a GPU: compiles the device code of
# src/kernels/cuda/moe_mlp_wgmma.cu as C++ against the CPU emulation (tests/kernels/emu/cuda_emulation.h,
# moe_decode_emulation.h, moe_wgmma_emulation.h: one std::thread per CUDA thread) and compares u and y
# with the CPU reference on small shapes and several grid sizes, for every kernel variant
# (moe_wgmma::Variants; EMULATE_VARIANT=N runs only N, EMULATE_SHAPE=name only that shape); about a
# minute per variant on 2 cores.
#   usage: scripts/emulate_moe_wgmma.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_moe_wgmma"
mkdir -p "$out"
k="$root/src/kernels/cuda"
{
  echo '#pragma once'
  echo 'namespace osprey::cuda {'
  sed -n '/^__host__ __device__ inline int moe_u_column/,/^}/p' "$k/moe_mlp_mxfp4.h"
  echo '}  // namespace osprey::cuda'
} > "$out/moe_u_column.h"
grep -q "moe_u_column(int j)" "$out/moe_u_column.h"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -include algorithm -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_moe_wgmma.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_moe_wgmma"
[ "${EMULATE_BUILD_ONLY:-0}" = 1 ] || "$out/emulate_moe_wgmma" "$seed"
