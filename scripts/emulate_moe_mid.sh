#!/usr/bin/env bash
# Checks the mid-batch MoE kernels' logic (item table, token blocks and work split, the chunk ring and
# its refills, the partial-sum ring, B fragments in registers, u tile layout, fragment mapping, FP4
# decode, partial k-steps, epilogues) on a machine without a GPU: extracts the device code of
# src/kernels/cuda/moe_mid.cu, compiles it as C++ against the CPU emulation
# (tests/kernels/emu/cuda_emulation.h + moe_decode_emulation.h: one std::thread per CUDA thread) and
# compares with the CPU reference on small shapes (9..128 tokens, skewed routings, grids of 2 to 132
# CTAs) for every variant (kMoeMidVariants; the default one with the most cases), and on the 20b /
# 120b shapes on a few of their 132 CTAs.
#   usage: scripts/emulate_moe_mid.sh BUILD_DIR [seed [variants|big|quick]]
#          ("variants": only the other variants' cases; "big": only the 20b / 120b cases; "quick": a few
#          cases of every kind; the default runs everything: hours on 2 shared cores)
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_moe_mid"
mkdir -p "$out"
k="$root/src/kernels/cuda"
{
  echo '#include "moe_decode_emulation.h"'
  echo '#include "kernels/cuda/mxfp4_words.h"'
  echo 'inline dim3 blockDim;'
  echo 'namespace osprey::cuda {'
  grep -E "^inline constexpr int kMoeMaxExperts" "$k/moe_route.h"
  sed -n '/^struct Mxfp4Experts {/,/^};/p' "$k/moe_mlp_mxfp4.h"
  echo '}  // namespace osprey::cuda'
  sed -n '/^namespace osprey::cuda {/,/^}  \/\/ namespace osprey::cuda/p' "$k/moe_mid.h"
  sed -n '/^namespace osprey::cuda {/,/^}  \/\/ namespace osprey::cuda/p' "$k/moe_fp4.cuh"
  sed -n '/^namespace osprey::cuda {/,$p' "$k/moe_mid.cu" |
    sed 's/extern __shared__ __align__([0-9]*) uint8_t smem\[\];/uint8_t* smem = g_dyn_smem;/'
} > "$out/moe_mid_emulated.h"
grep -q "uint8_t\* smem = g_dyn_smem;" "$out/moe_mid_emulated.h"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_moe_mid.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread \
  -o "$out/emulate_moe_mid"
"$out/emulate_moe_mid" "$seed" ${3:-}
