#!/usr/bin/env bash
# Checks the decode MoE kernels' logic (work split, split-tile pieces and arrival counters, staging
# layout, fragment mapping, FP4 decode, epilogues) on a machine without a GPU: extracts the device
# code of src/kernels/cuda/moe_decode.cu, compiles it as C++ against the CPU emulation
# (tests/kernels/emu/cuda_emulation.h + moe_decode_emulation.h: one std::thread per CUDA thread) and
# compares with the CPU reference on small shapes and several grid sizes (a few minutes on 2 cores).
#   usage: scripts/emulate_moe_decode.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_moe_decode"
mkdir -p "$out"
k="$root/src/kernels/cuda"
{
  echo '#include "moe_decode_emulation.h"'
  echo '#include "kernels/cuda/mxfp4_words.h"'
  echo 'namespace osprey::cuda {'
  grep -E "^inline constexpr int kMoeMaxExperts" "$k/moe_route.h"
  grep -E "^inline constexpr int kMoeDecodeMaxTokens" "$k/moe_decode.h"
  sed -n '/^struct Mxfp4Experts {/,/^};/p' "$k/moe_mlp_mxfp4.h"
  sed -n '/^__host__ __device__ inline int moe_u_column/,/^}/p' "$k/moe_mlp_mxfp4.h"
  sed -n '/^struct MoeDecodeArgs {/,/^};/p' "$k/moe_decode.h"
  sed -n '/^__device__ __forceinline__ bool topk_ranks_before/,/^}  \/\/ namespace osprey::cuda/p' "$k/moe_topk.cuh" | sed '$d'
  echo '}  // namespace osprey::cuda'
  sed -n '/^namespace osprey::cuda {/,/^}  \/\/ namespace osprey::cuda/p' "$k/moe_fp4.cuh"
  sed -n '/^namespace osprey::cuda {/,$p' "$k/moe_decode.cu" |
    sed 's/extern __shared__ __align__([0-9]*) uint8_t smem\[\];/uint8_t* smem = g_dyn_smem;/'
} > "$out/moe_decode_emulated.h"
grep -q "uint8_t\* smem = g_dyn_smem;" "$out/moe_decode_emulated.h"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_moe_decode.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_moe_decode"
"$out/emulate_moe_decode" "$seed"
