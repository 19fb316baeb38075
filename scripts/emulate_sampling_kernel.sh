#!/usr/bin/env bash
# Checks the CUDA sampling kernel's logic on a machine without a GPU: extracts the device code of
# src/kernels/cuda/sampling.cu, compiles it as C++ against a CPU emulation of the CUDA features it uses
# (tests/kernels/emu/cuda_emulation.h) and compares it with the CPU sampler (about 2-4 minutes on 2 cores).
#   usage: scripts/emulate_sampling_kernel.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_kernels_cpu and osprey_core built (ninja -C BUILD_DIR
#   osprey_kernels_cpu). OSPREY_EMU_SMALL_SKIP=1 shrinks the walk's skip ranges so that the vocab-20000
#   rows also take the 65536-key level.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_sampling"
mkdir -p "$out"
src="$root/src/kernels/cuda/sampling.cu"
hdr="$root/src/kernels/cuda/sampling.h"
{
  echo '#include "cuda_emulation.h"'
  echo '#include "kernels/cuda/sampling_pack.h"'
  echo 'namespace osprey::cuda {'
  echo 'inline constexpr int kWarpSize = 32;'
  grep -E "inline constexpr int kSample(Threads|Chunk)" "$hdr"
  sed -n '/^struct SampleRowsArgs {/,/^};/p' "$hdr"
  echo '}'
  sed -n '/^namespace osprey::cuda {/,/^}  \/\/ namespace$/p' "$src"
  cat <<'CPP'
// One block after the other, a std::thread per CUDA thread.
void emu_launch(const SampleRowsArgs& a) {
    const int ld = a.ld ? a.ld : a.vocab_size;
    for (int r = 0; r < a.n_rows; ++r) {
        const EmuCtaSync sync(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t] {
                threadIdx.x = unsigned(t);
                blockIdx.x = unsigned(r);
                sample_rows_kernel(a, ld);
            });
        for (auto& th : threads) th.join();
    }
}
}  // namespace osprey::cuda
CPP
} > "$out/sampling_emulated.h"
if [[ "${OSPREY_EMU_SMALL_SKIP:-0}" == 1 ]]; then
  sed -i 's/kSkipBig = 65536, kSkipMid = 8192/kSkipBig = 6000, kSkipMid = 2600/' "$out/sampling_emulated.h"
fi
grep -q "void emu_launch" "$out/sampling_emulated.h"
g++ -std=c++20 -O1 -ffp-contract=off -include memory -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_sampling.cpp" \
  "$build/src/kernels/cpu/libosprey_kernels_cpu.a" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_sampling"
"$out/emulate_sampling" "$seed"
