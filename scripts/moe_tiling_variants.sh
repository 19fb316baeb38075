#!/usr/bin/env bash
# Builds one bench_moe per MXFP4 MoE tiling, for A/B runs on the GPU: each variant recompiles
# src/kernels/cuda/moe_mlp_mxfp4.cu with one of its Config lists overridden (OSPREY_MOE_NARROW_CONFIG,
# OSPREY_MOE_GEMV_CONFIG or OSPREY_MOE_GEMM_CONFIG, through a wrapper source: nvcc's -D splits on commas),
# puts the object into a copy of the build's libosprey_kernels_cuda.a and relinks bench_moe against it.
# Prints each variant's registers and spills (ptxas). Run the binaries with `--filter` and `--check`
# (bench/kernel_bench.h); docs/performance.md, eighth session, has a sweep made this way.
#   scripts/moe_tiling_variants.sh BUILD OUT MACRO NAME=LIST [NAME=LIST ...]
#   e.g. scripts/moe_tiling_variants.sh build /tmp/var OSPREY_MOE_NARROW_CONFIG A=4,1,2,2,32,3,3 B=4,1,2,1,32,4,3
#   BUILD: a build folder with bench_moe built (ninja -C BUILD bench/bench_moe).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: $0 BUILD OUT MACRO NAME=LIST...}" && pwd)"
out="${2:?usage: $0 BUILD OUT MACRO NAME=LIST...}"
macro="${3:?usage: $0 BUILD OUT MACRO NAME=LIST...}"
shift 3
case "$macro" in
  OSPREY_MOE_NARROW_CONFIG|OSPREY_MOE_GEMV_CONFIG|OSPREY_MOE_GEMM_CONFIG) ;;
  *) echo "moe_tiling_variants: MACRO must be OSPREY_MOE_{NARROW,GEMV,GEMM}_CONFIG, got '$macro'" >&2; exit 2 ;;
esac
[[ $# -gt 0 ]] || { echo "moe_tiling_variants: no NAME=LIST given" >&2; exit 2; }
lib="$build/src/kernels/cuda/libosprey_kernels_cuda.a"
obj="$build/bench/CMakeFiles/bench_moe.dir/bench_moe.cu.o"
[[ -f "$lib" && -f "$obj" ]] || { echo "moe_tiling_variants: build bench_moe in $build first" >&2; exit 1; }
# bench_moe's link line, as ninja has it, with the kernels library swapped below.
link="$(cd "$build" && ninja -t commands bench/bench_moe | tail -1 | sed 's/^: && //; s/ && :$//')"
[[ "$link" == *libosprey_kernels_cuda.a* && "$link" == *" -o bench/bench_moe "* ]] || { echo "moe_tiling_variants: unexpected link line: $link" >&2; exit 1; }
mkdir -p "$out"
for v in "$@"; do
  name="${v%%=*}" list="${v#*=}"
  [[ "$name" =~ ^[A-Za-z0-9_]+$ && "$list" =~ ^[0-9]+(,[0-9]+){6}$ ]] ||
    { echo "moe_tiling_variants: '$v' is not NAME=seven,comma,separated,integers" >&2; exit 2; }
  printf '#define %s %s\n#include "kernels/cuda/moe_mlp_mxfp4.cu"\n' "$macro" "$list" > "$out/moe_$name.cu"
  /usr/local/cuda/bin/nvcc -I"$here/src" -O3 -DNDEBUG -Xcompiler=-fPIC -gencode=arch=compute_90a,code=sm_90a \
    -lineinfo --expt-relaxed-constexpr -std=c++20 -x cu -c "$out/moe_$name.cu" -o "$out/moe_$name.o" \
    --resource-usage > "$out/ptxas_$name.txt" 2>&1 || { cat "$out/ptxas_$name.txt" >&2; exit 1; }
  cp "$lib" "$out/lib_$name.a"
  ar d "$out/lib_$name.a" moe_mlp_mxfp4.cu.o
  ar q "$out/lib_$name.a" "$out/moe_$name.o"
  cmd="${link//src\/kernels\/cuda\/libosprey_kernels_cuda.a/$out/lib_$name.a}"
  cmd="${cmd/ -o bench\/bench_moe / -o $out/bench_moe_$name }"
  (cd "$build" && eval "$cmd")
  regs="$(awk '/Function properties for/ {f = $NF} /registers/ && f ~ /moe_mlp_mxfp4_kernel/ {print $5}' "$out/ptxas_$name.txt" | sort -un | tr '\n' ' ')"
  spills="$(grep -cE '(^|[^0-9])[1-9][0-9]* bytes spill stores' "$out/ptxas_$name.txt" || true)"
  echo "$name ($list): $out/bench_moe_$name; registers of the kernel instances: $regs; instances that spill: $spills"
done
