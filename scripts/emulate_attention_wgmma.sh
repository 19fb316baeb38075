#!/usr/bin/env bash
# Checks the wgmma prefill attention kernel's logic (producer/consumer protocol, mbarrier phases, the
# consumers' turn barriers, swizzled tile addressing against the wgmma descriptors, fragment layouts,
# masking, online softmax with the sink; the FP8 KV cache's dequantising producer) on a machine without a GPU: extracts the device code of
# src/kernels/cuda/attention_prefill_wgmma.cu, compiles it as C++ against the CPU emulation
# (tests/kernels/emu/wgmma_emulation.h: one std::thread per CUDA thread, wgmma from the PTX ISA's
# canonical layouts) and compares with the CPU reference on small shapes. Every variant of the kernel
# (kAttnWgmmaVariants in attention.h) runs every case, the persistent ones on a grid of 3 CTAs so that
# each CTA loops over several (item, KV head) units (about three minutes for all on 2 cores).
# What it cannot check: timing, register-level asynchrony of wgmma, setmaxnreg, and whether the PTX
# wrappers in wgmma.cuh encode what the emulation assumes (the H200 test does).
#   usage: scripts/emulate_attention_wgmma.sh BUILD_DIR [seed [variant...]]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed [variant...]]}"
seed="${2:-1}"
shift $(( $# > 1 ? 2 : 1 ))
out="$build/emulate_attention_wgmma"
mkdir -p "$out"
k="$root/src/kernels/cuda"
{
  echo '#include "attention_emulation.h"'
  echo '#include "kernels/cuda/kv_fp8.cuh"'
  echo '#include "kernels/cuda/kv_cache_row.cuh"'
  echo 'namespace osprey::cuda {'
  grep -E "^inline constexpr int k(AttnHeadDim|AttnGroup|AttnKeyTile|PrefillTokens|WgmmaPrefillTokens) " "$k/attention.h"
  sed -n '/^struct AttnWgmmaVariant {/,/^};/p' "$k/attention.h"
  sed -n '/^inline constexpr AttnWgmmaVariant kAttnWgmmaVariants/,/^};/p' "$k/attention.h"
  grep -E "^inline constexpr int kAttnWgmmaVariantCount" "$k/attention.h"
  sed -n '/^constexpr int wgmma_prefill_tokens(int v) {$/,/^}/p' "$k/attention.h"
  sed -n '/^struct AttnItem {/,/^};/p' "$k/attention.h"
  sed -n '/^struct KvFp8 {/,/^};/p' "$k/kv_fp8.h" | sed 's/OSPREY_KV_FP8_HD //'
  sed -n '/^struct AttnArgs {/,/^};/p' "$k/attention.h"
  sed -n '/^__device__ __forceinline__ size_t attention_cache_row(/,/^}/p' "$k/attention_kv.cuh"
  sed -n '/^__device__ inline void attention_kv_rows(/,/^}/p' "$k/attention_kv.cuh"
  sed -n '/^__device__ inline void attention_kv_rows_fp8(/,/^}/p' "$k/attention_kv.cuh"
  echo 'namespace sm90 {'
  sed -n '/^__host__ __device__ constexpr uint32_t sw128_offset/,/^}/p' "$k/wgmma.cuh"
  sed -n '/^__device__ __forceinline__ uint64_t desc_sw128/,/^}/p' "$k/wgmma.cuh"
  echo '}  // namespace sm90'
  echo '}  // namespace osprey::cuda'
  sed -n '/^namespace osprey::cuda {/,/^\/\/ ---- end of device code/p' "$k/attention_prefill_wgmma.cu" |
    sed 's/extern __shared__ __align__(1024) uint8_t smem_raw\[\];/uint8_t* smem_raw = g_dyn_smem;/'
  echo '}  // namespace osprey::cuda'
} > "$out/attention_wgmma_emulated.h"
grep -q "uint8_t\* smem_raw = g_dyn_smem;" "$out/attention_wgmma_emulated.h"
grep -q "attention_kv_rows" "$out/attention_wgmma_emulated.h"
grep -q "size_t attention_cache_row(" "$out/attention_wgmma_emulated.h"
grep -q "attention_kv_rows_fp8" "$out/attention_wgmma_emulated.h"
grep -q "kAttnWgmmaVariants\[\] = {" "$out/attention_wgmma_emulated.h"
grep -q "wgmma_prefill_tokens(int v)" "$out/attention_wgmma_emulated.h"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -include climits -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_attention_wgmma.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_attention_wgmma"
"$out/emulate_attention_wgmma" "$seed" "$@"
