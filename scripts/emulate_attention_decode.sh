#!/usr/bin/env bash
# Checks the decode attention kernels' logic (the BF16 kernel and the FP8-KV one: cp.async stages,
# fragment layouts, the FP8 kernel's swizzled code rows and permuted dimensions, masking, online
# softmax, the split merge with the sink counted once, fused and by the merge kernel, RoPE fused into the
# BF16 kernel with its K/V store) on a machine
# without a GPU: extracts the device code of src/kernels/cuda/attention.cu between its "decode device
# code" markers, compiles it as C++ against the CPU emulation (tests/kernels/emu/attention_emulation.h:
# one std::thread per CUDA thread, mma.sync and ldmatrix from the PTX fragment layouts, E4M3 through
# core/fp8.h) and compares with the CPU reference on small shapes (well under a minute on 2 cores).
# What it cannot check: timing, bank conflicts, and whether the PTX of cvt.*e4m3x2 / prmt does what the
# software path of kv_fp8.cuh does (the H200 test does).
#   usage: scripts/emulate_attention_decode.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_attention_decode"
mkdir -p "$out"
k="$root/src/kernels/cuda"
{
  echo '#include "attention_emulation.h"'
  echo '#include "kernels/cuda/kv_fp8.cuh"'
  echo '#include "kernels/cuda/kv_cache_row.cuh"'
  echo 'namespace osprey::cuda {'
  grep -E "^inline constexpr int k(AttnHeadDim|AttnGroup|AttnKeyTile|PrefillTokens|MinKeysPerSplit) " "$k/attention.h"
  sed -n '/^struct AttnItem {/,/^};/p' "$k/attention.h"
  sed -n '/^struct AttnMerge {/,/^};/p' "$k/attention.h"
  sed -n '/^struct KvFp8 {/,/^};/p' "$k/kv_fp8.h"
  sed -n '/^struct AttnArgs {/,/^};/p' "$k/attention.h"
  sed -n '/^__device__ __forceinline__ size_t attention_cache_row(/,/^}/p' "$k/attention_kv.cuh"
  sed -n '/^__device__ inline void attention_kv_rows(/,/^}/p' "$k/attention_kv.cuh"
  sed -n '/^__device__ __forceinline__ void rope_pair(/,/^}/p' "$k/rope_pair.cuh"
  sed -n '/^__device__ inline void attention_kv_rows_fp8(/,/^}/p' "$k/attention_kv.cuh"
  sed -n '/^\/\/ ---- decode device code/,/^\/\/ ---- end of decode device code/p' "$k/attention.cu" |
    sed 's/extern __shared__ __align__(16) unsigned char smem_raw\[\];/unsigned char* smem_raw = g_dyn_smem;/'
  echo '}  // namespace osprey::cuda'
} > "$out/attention_decode_emulated.h"
sed -i 's/OSPREY_KV_FP8_HD //' "$out/attention_decode_emulated.h"
[ "$(grep -c "unsigned char\* smem_raw = g_dyn_smem;" "$out/attention_decode_emulated.h")" = 2 ]
grep -q "attention_decode_fp8_kernel" "$out/attention_decode_emulated.h"
grep -q "size_t attention_cache_row(" "$out/attention_decode_emulated.h"
grep -q "attention_kv_rows_fp8" "$out/attention_decode_emulated.h"
grep -q "void rope_pair" "$out/attention_decode_emulated.h"
g++ -std=c++20 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -include memory -include barrier -include thread \
  -include climits -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_attention_decode.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_attention_decode"
"$out/emulate_attention_decode" "$seed"
